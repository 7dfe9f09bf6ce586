//! Images: the read-only root trees sessions run on. Host-wide, not tenant-scoped: any tenant
//! (or operator) key lists and inspects them, since every tenant may run sessions on them;
//! deleting one takes it from every tenant, so only an admin key may. Imports and builds
//! (`builds`: a template spec built step by step in jails, with the build-only network
//! exemptions) make host-wide images too: admin keys only, their status and logs as well.

use axum::body::Body;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::{get, post};
use axum::Router;
use futures::{Stream, StreamExt as _};
use koder_api_types::{codes, Build, ErrorBody, Image, ImageList};
use koder_build::{BuildError, Builds, LogEvent};

/// The queue native builds wait in: the operator's (admin keys build host-wide images), taking
/// turns with each tenant's E2B template builds. No tenant id has a colon.
const OPERATOR: &str = ":operator";
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
        .route("/builds", post(create_build))
        .route("/builds/{id}", get(get_build))
        .route("/builds/{id}/logs", get(build_logs))
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
              (status = 409, body = ErrorBody, description = "SANDBOX-IMAGE-IN-USE: a running or paused session, a snapshot not yet expired, a create in flight or a configured warm pool uses it")),
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
        return Err(too_large(MAX_ARCHIVE_BYTES));
    }
    let scratch = store.scratch("upload");
    receive(body, scratch.path(), MAX_ARCHIVE_BYTES).await?;
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
    s.manager.publish_image(&q.name).await?;
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

/// Streams the body into `path`, refusing it (413, `SANDBOX-IMAGE-TOO-LARGE`) past `limit`
/// bytes: image archives, and the E2B template builds' file uploads.
pub async fn receive(body: Body, path: &std::path::Path, limit: u64) -> ApiResult<()> {
    let io =
        |e: std::io::Error| ApiError::new(500, codes::INTERNAL, format!("store the upload: {e}"));
    let mut file = tokio::fs::File::create(path).await.map_err(io)?;
    let mut chunks = body.into_data_stream();
    let mut total = 0u64;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| ApiError::invalid(format!("reading the body: {e}")))?;
        total += chunk.len() as u64;
        if total > limit {
            return Err(too_large(limit));
        }
        file.write_all(&chunk).await.map_err(io)?;
    }
    file.flush().await.map_err(io)
}

fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        413,
        IMAGE_TOO_LARGE,
        format!("image archives are limited to {limit} bytes"),
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

/// Largest template spec (files to copy are inline in it).
pub const MAX_SPEC_BYTES: usize = 8 << 20;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct BuildQuery {
    /// The name the image gets once every step passed (`app`, `app:1.2`).
    pub name: String,
}

#[utoipa::path(post, path = "/v1/sandbox/images/builds", tag = "images",
    description = "Builds an image from a template spec (the body: TOML, or JSON with \
        `Content-Type: application/json`; files to copy are inline, `[[files]] dest/content/mode`). \
        Each step (apt, pip, npm, files, run) runs as root in a jail on the previous step's image \
        with network `open` (and `[images] build_internal`), cached by its key: a rebuild reruns \
        only the steps from the first changed one. The image appears, named, only once every \
        step passed. Answers at once; follow `GET .../builds/{id}` or `.../logs`. Admin key only.",
    params(BuildQuery),
    request_body(content = String, content_type = "application/toml"),
    responses((status = 202, body = Build, description = "the build, queued"),
              (status = 400, body = ErrorBody, description = "SANDBOX-IMAGE-BUILD-INVALID-SPEC: the spec or the name"),
              (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody, description = "a tenant key"),
              (status = 404, body = ErrorBody, description = "SANDBOX-IMAGE-NOT-FOUND: the base image"),
              (status = 413, body = ErrorBody, description = "a spec over 8 MiB"),
              (status = 501, body = ErrorBody, description = "this server has no image store")),
    security(("bearer" = [])))]
pub async fn create_build(
    State(s): State<AppState>,
    _: AdminCaller,
    Query(q): Query<BuildQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<Build>)> {
    let bytes = axum::body::to_bytes(body, MAX_SPEC_BYTES)
        .await
        .map_err(|_| {
            ApiError::new(
                413,
                codes::PAYLOAD_TOO_LARGE,
                format!("template specs are limited to {MAX_SPEC_BYTES} bytes"),
            )
        })?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| build_error(BuildError::InvalidSpec("the spec is not UTF-8".into())))?;
    let json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let spec = Builds::parse(text, json).map_err(build_error)?;
    s.manager.sync_image(&spec.base).await?;
    let build = s
        .builds
        .submit(spec, &q.name, OPERATOR)
        .map_err(build_error)?;
    tracing::info!(build = %build.build_id, image = %q.name, "image build queued");
    Ok((StatusCode::ACCEPTED, axum::Json(build)))
}

#[utoipa::path(get, path = "/v1/sandbox/images/builds/{id}", tag = "images",
    description = "A build's status: `queued`, `running`, `succeeded` (with the digest) or `failed` \
        (`failed_step`, `error` with SANDBOX-IMAGE-BUILD-STEP-FAILED and the step's output, or \
        SANDBOX-IMAGE-BUILD-FAILED), each step's status (`cached`, `built`, ...), the log's tail. Admin key only.",
    params(("id" = String, Path)),
    responses((status = 200, body = Build), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody, description = "a tenant key"),
              (status = 404, body = ErrorBody, description = "SANDBOX-IMAGE-BUILD-NOT-FOUND"),
              (status = 500, body = ErrorBody, description = "a build this daemon no longer holds could not be read from the store")),
    security(("bearer" = [])))]
pub async fn get_build(
    State(s): State<AppState>,
    _: AdminCaller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Build>> {
    Ok(axum::Json(s.builds.get(&id).await.map_err(build_error)?))
}

#[utoipa::path(get, path = "/v1/sandbox/images/builds/{id}/logs", tag = "images",
    description = "The build's log as Server-Sent Events: every line so far, then (while it runs) each \
        new one, as `log` events (`data`: `{\"line\": ...}`); the last event is `done` with the final status \
        (a `Build` as JSON). A finished build is replayed, also after a restart (from the store); \
        a build another node is running has no lines here until it ended. Admin key only.",
    params(("id" = String, Path)),
    responses((status = 200, content_type = "text/event-stream", description = "`log` events, then `done`"),
              (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody, description = "a tenant key"),
              (status = 404, body = ErrorBody, description = "SANDBOX-IMAGE-BUILD-NOT-FOUND"),
              (status = 500, body = ErrorBody, description = "a build this daemon no longer holds could not be read from the store")),
    security(("bearer" = [])))]
pub async fn build_logs(
    State(s): State<AppState>,
    _: AdminCaller,
    Path(id): Path<String>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, std::convert::Infallible>>>> {
    let follow = s.builds.follow(&id).await.map_err(build_error)?;
    let replay = futures::stream::iter(follow.replay.into_iter().map(log_event));
    let live = futures::stream::unfold((follow.live, follow.done), |(mut live, done)| async move {
        if let Some(done) = done {
            return Some((done_event(&done), (None, None)));
        }
        let event = match live.as_mut()?.recv().await {
            Ok(LogEvent::Line(line)) => log_event(line),
            Ok(LogEvent::Done(done)) => return Some((done_event(&done), (None, None))),
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                log_event(format!("[{n} lines skipped: this follower fell behind]"))
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
        };
        Some((event, (live, None)))
    });
    Ok(Sse::new(replay.chain(live).map(Ok)).keep_alive(KeepAlive::default()))
}

fn log_event(line: String) -> Event {
    Event::default()
        .event("log")
        .data(serde_json::json!({ "line": line }).to_string())
}

fn done_event(build: &Build) -> Event {
    Event::default()
        .event("done")
        .data(serde_json::to_string(build).unwrap_or_default())
}

fn build_error(e: BuildError) -> ApiError {
    let code = e.code();
    ApiError::new(crate::error::status_of(code), code.as_str(), e.to_string())
}
