//! Images: the read-only root trees sessions run on. Host-wide, not tenant-scoped: any tenant
//! (or operator) key lists and inspects them, since every tenant may run sessions on them;
//! deleting one takes it from every tenant, so only an admin key may.

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::routing::get;
use axum::Router;
use koder_api_types::{ErrorBody, Image, ImageList};

use crate::error::ApiError;
use crate::extract::{AdminCaller, Caller, Path};
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

/// Routes under `/v1/sandbox/images`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(list_images))
        .route("/{name}", get(get_image).delete(delete_image))
}

/// A tenant or an operator: images are everyone's to see.
pub struct Reader;

impl FromRequestParts<AppState> for Reader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match Caller::from_request_parts(parts, state).await {
            Ok(_) => Ok(Reader),
            Err(tenant) => match AdminCaller::from_request_parts(parts, state).await {
                Ok(_) => Ok(Reader),
                Err(_) => Err(tenant),
            },
        }
    }
}

#[utoipa::path(get, path = "/v1/sandbox/images", tag = "images",
    description = "Every image sessions can name: `host` first, then the store's (language packs).",
    responses((status = 200, body = ImageList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_images(State(s): State<AppState>, _: Reader) -> ApiResult<axum::Json<ImageList>> {
    Ok(axum::Json(s.manager.list_images().await?))
}

#[utoipa::path(get, path = "/v1/sandbox/images/{name}", tag = "images",
    description = "One image by name or digest, with its recipe and the end of its build log.",
    params(("name" = String, Path, description = "`host`, a name (`python`, `python:3.11`) or a digest")),
    responses((status = 200, body = Image), (status = 400, body = ErrorBody, description = "not a valid image name"),
              (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody, description = "SANDBOX-IMAGE-NOT-FOUND")),
    security(("bearer" = [])))]
pub async fn get_image(
    State(s): State<AppState>,
    _: Reader,
    Path(name): Path<String>,
) -> ApiResult<axum::Json<Image>> {
    Ok(axum::Json(s.manager.get_image(&name).await?))
}

#[utoipa::path(delete, path = "/v1/sandbox/images/{name}", tag = "images",
    description = "Deletes an image (with every name of it). Admin key only: images are host-wide.",
    params(("name" = String, Path, description = "one of the image's names")),
    responses((status = 200, body = Image, description = "what was deleted"),
              (status = 400, body = ErrorBody, description = "`host`, a digest, or not a valid name"),
              (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody, description = "a tenant key"),
              (status = 404, body = ErrorBody, description = "SANDBOX-IMAGE-NOT-FOUND"),
              (status = 409, body = ErrorBody, description = "SANDBOX-IMAGE-IN-USE: a running or paused session, a create in flight or a configured warm pool uses it")),
    security(("bearer" = [])))]
pub async fn delete_image(
    State(s): State<AppState>,
    _: AdminCaller,
    Path(name): Path<String>,
) -> ApiResult<axum::Json<Image>> {
    Ok(axum::Json(s.manager.delete_image(&name).await?))
}
