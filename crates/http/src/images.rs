//! Images: the read-only root trees sessions run on. Host-wide, not tenant-scoped: any tenant
//! (or operator) key lists and inspects them, since every tenant may run sessions on them;
//! deleting one takes it from every tenant, so only an admin key may.

use axum::body::Body;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use futures::StreamExt as _;
use koder_api_types::{codes, ErrorBody, Image, ImageList};
use koder_image::{ImageError, ImageStore};
use serde::Deserialize;
use tokio::io::AsyncWriteExt as _;

use crate::error::ApiError;
use crate::extract::{declared_length, AdminCaller, Caller, Path, Query};
use crate::AppState;

/// The largest image archive an import accepts.
pub const MAX_ARCHIVE_BYTES: u64 = 8 << 30;
/// An archive entry that would leave the tree or write through a link.
pub const IMAGE_FORBIDDEN_ENTRY: &str = "SANDBOX-IMAGE-FORBIDDEN-ENTRY";
/// An archive that is no image: unreadable, no manifest, a layer its config does not name.
pub const IMAGE_INVALID_ARCHIVE: &str = "SANDBOX-IMAGE-INVALID-ARCHIVE";
/// An archive over its bounds (upload size, unpacked bytes, entries).
pub const IMAGE_TOO_LARGE: &str = "SANDBOX-IMAGE-TOO-LARGE";

type ApiResult<T> = Result<T, ApiError>;

/// Routes under `/v1/sandbox/images`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(list_images))
        .route("/import", post(import_image))
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

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ImportQuery {
    /// The name the image gets (`app`, `app:1.2`); an existing name is moved to it.
    pub name: String,
}

#[utoipa::path(post, path = "/v1/sandbox/images/import", tag = "images",
    description = "Imports an OCI image layout tar or a `docker save` tar (the request body, \
        streamed to disk): its layers are unpacked in order (whiteouts applied, devices and \
        setuid bits dropped) into a new image named `name`, env, working directory, user and \
        command from its config. The same image imported again is found. Admin key only.",
    params(ImportQuery),
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses((status = 201, body = Image, description = "the imported image"),
              (status = 400, body = ErrorBody, description = "SANDBOX-IMAGE-INVALID-ARCHIVE: no image archive; SANDBOX-IMAGE-FORBIDDEN-ENTRY: an entry with `..`, an absolute path or a symlink in its path; SANDBOX-INVALID-ARGUMENT: a bad name"),
              (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody, description = "a tenant key"),
              (status = 413, body = ErrorBody, description = "SANDBOX-IMAGE-TOO-LARGE: the archive, its unpacked bytes or its entries over their bounds"),
              (status = 501, body = ErrorBody, description = "this server has no image store")),
    security(("bearer" = [])))]
pub async fn import_image(
    State(s): State<AppState>,
    _: AdminCaller,
    Query(q): Query<ImportQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<Image>)> {
    let store = store_of(&s)?;
    koder_image::store::check_name(&q.name).map_err(image_api_error)?;
    if declared_length(&headers).is_some_and(|n| n > MAX_ARCHIVE_BYTES) {
        return Err(too_large());
    }
    let scratch = store.scratch("upload");
    receive(body, scratch.path()).await?;
    let name = q.name.clone();
    tokio::task::spawn_blocking(move || {
        koder_image::oci::import(
            &store,
            scratch.path(),
            &name,
            koder_image::oci::Limits::default(),
        )
    })
    .await
    .map_err(|e| ApiError::new(500, codes::INTERNAL, format!("import task: {e}")))?
    .map_err(image_api_error)?;
    tracing::info!(image = %q.name, "image imported");
    Ok((
        StatusCode::CREATED,
        axum::Json(s.manager.get_image(&q.name).await?),
    ))
}

fn store_of(s: &AppState) -> ApiResult<ImageStore> {
    s.manager.image_store().cloned().ok_or_else(|| {
        ApiError::new(
            501,
            codes::NOT_IMPLEMENTED,
            "this server has no image store",
        )
    })
}

/// Streams the body into `path`, refusing it past [`MAX_ARCHIVE_BYTES`].
async fn receive(body: Body, path: &std::path::Path) -> ApiResult<()> {
    let io =
        |e: std::io::Error| ApiError::new(500, codes::INTERNAL, format!("store the upload: {e}"));
    let mut file = tokio::fs::File::create(path).await.map_err(io)?;
    let mut chunks = body.into_data_stream();
    let mut total = 0u64;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| ApiError::invalid(format!("reading the body: {e}")))?;
        total += chunk.len() as u64;
        if total > MAX_ARCHIVE_BYTES {
            return Err(too_large());
        }
        file.write_all(&chunk).await.map_err(io)?;
    }
    file.flush().await.map_err(io)
}

fn too_large() -> ApiError {
    ApiError::new(
        413,
        IMAGE_TOO_LARGE,
        format!("image archives are limited to {MAX_ARCHIVE_BYTES} bytes"),
    )
}

/// An image error as the API answers it.
pub fn image_api_error(e: ImageError) -> ApiError {
    match e {
        ImageError::Forbidden { .. } => ApiError::new(400, IMAGE_FORBIDDEN_ENTRY, e.to_string()),
        ImageError::InvalidArchive(_) => ApiError::new(400, IMAGE_INVALID_ARCHIVE, e.to_string()),
        ImageError::TooLarge(_) => ApiError::new(413, IMAGE_TOO_LARGE, e.to_string()),
        ImageError::InvalidName(_) => ApiError::new(400, codes::INVALID_ARGUMENT, e.to_string()),
        ImageError::NotFound(_) => ApiError::new(404, codes::IMAGE_NOT_FOUND, e.to_string()),
        other => ApiError::new(500, codes::INTERNAL, other.to_string()),
    }
}
