//! Webhooks: a tenant's endpoints for its sessions' events, and their delivery logs.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::Router;
use koder_api_types::{ErrorBody, ErrorCode};
use koder_webhooks::api::{CreateWebhook, DeliveryList, Webhook, WebhookList};
use koder_webhooks::WebhookError;

use crate::error::ApiError;
use crate::extract::{Caller, Json, Path};
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

/// Routes under `/v1/sandbox/webhooks`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", post(create_webhook).get(list_webhooks))
        .route("/{id}", delete(delete_webhook))
        .route("/{id}/deliveries", get(list_deliveries))
}

impl From<WebhookError> for ApiError {
    fn from(e: WebhookError) -> Self {
        let code = e.code();
        if code == ErrorCode::Internal {
            tracing::error!(error = %e, "webhook request failed");
        }
        ApiError::new(crate::error::status_of(code), code.as_str(), e.to_string())
    }
}

#[utoipa::path(post, path = "/v1/sandbox/webhooks", tag = "webhooks",
    description = "Registers an endpoint for the tenant's session events. The answer carries the signing secret, shown only here.",
    request_body = CreateWebhook,
    responses((status = 201, body = Webhook),
              (status = 400, body = ErrorBody, description = "SANDBOX-INVALID-ARGUMENT: a malformed url, an unknown event type, a short secret; SANDBOX-WEBHOOK-URL-REFUSED: the url reaches a loopback, private or reserved address"),
              (status = 409, body = ErrorBody, description = "the tenant has as many webhooks as allowed"),
              (status = 413, body = ErrorBody), (status = 415, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_webhook(
    State(s): State<AppState>,
    Caller(who): Caller,
    Json(req): Json<CreateWebhook>,
) -> ApiResult<(StatusCode, axum::Json<Webhook>)> {
    let hook = s.webhooks.create(&who.tenant_id, req).await?;
    Ok((StatusCode::CREATED, axum::Json(hook)))
}

#[utoipa::path(get, path = "/v1/sandbox/webhooks", tag = "webhooks",
    responses((status = 200, body = WebhookList)),
    security(("bearer" = [])))]
pub async fn list_webhooks(
    State(s): State<AppState>,
    Caller(who): Caller,
) -> ApiResult<axum::Json<WebhookList>> {
    let webhooks = s.webhooks.list(&who.tenant_id).await?;
    Ok(axum::Json(WebhookList { webhooks }))
}

#[utoipa::path(get, path = "/v1/sandbox/webhooks/{id}/deliveries", tag = "webhooks",
    description = "The endpoint's delivery log, newest first (at most 100).",
    params(("id" = String, Path)),
    responses((status = 200, body = DeliveryList), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_deliveries(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<DeliveryList>> {
    let deliveries = s.webhooks.deliveries(&who.tenant_id, &id).await?;
    Ok(axum::Json(DeliveryList { deliveries }))
}

#[utoipa::path(delete, path = "/v1/sandbox/webhooks/{id}", tag = "webhooks",
    description = "Removes the endpoint; its queued deliveries are dropped.",
    params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete_webhook(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    s.webhooks.delete(&who.tenant_id, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
