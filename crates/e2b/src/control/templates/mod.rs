//! E2B template builds (`Template.build` of E2B's SDKs) over `koder-build`: a template is a
//! set of images of the caller's tenant in the image store, one name per tag
//! (`e2b.<namespace>.<template>:<tag>`, the namespace keyed per tenant so no tenant names or
//! guesses another's), built from E2B's steps ([`steps`]) on a built-in template's image, a
//! template of the tenant's or an image of the store (`fromImage`: no registry is reachable;
//! an operator imports images first). The template id is its name.
//!
//! The SDK's flow: `POST /v3/templates` (a build id, nothing runs yet) → for each `COPY`,
//! `GET /templates/{id}/files/{hash}` (whether the tenant uploaded those files already, and a
//! signed URL back at this daemon) and a `PUT` of the tar there ([`files`]) → `POST
//! /v2/templates/{id}/builds/{build}` (the steps: the build starts) → `GET
//! .../builds/{build}/status` polled for logs until `ready` or `error`. Then `Sandbox.create`
//! names the template (`name` or `name:tag`), tags are assigned and removed, templates deleted.

mod files;
pub(crate) use files::sweep as sweep_files;
pub use files::TemplateFiles;

pub mod steps;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use chrono::{DateTime, SecondsFormat, Utc};
use koder_api_types::{Build, BuildState};
use koder_auth::Identity;
use koder_build::LogEvent;
use koder_image::{ImageStore, StoredImage, HOST};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{json, Value};

use super::keys::ApiCaller;
use super::{body, template_language, unsupported, TEMPLATES};
use crate::error::HttpError;
use crate::state::E2b;
use steps::StartBuild;

/// The tag a name without one means.
const DEFAULT_TAG: &str = "default";
/// Log entries per status answer, at most (E2B's page).
const LOG_PAGE: usize = 100;
/// The image E2B's SDK names for `from_base_image()`: what the `base` template is here.
const E2B_BASE_IMAGE: &str = "e2bdev/base";

pub fn routes() -> Router<E2b> {
    Router::new()
        .route("/v3/templates", post(request_build).fallback(unsupported))
        .route(
            "/templates/{id}/files/{hash}",
            get(files::upload_link)
                .put(files::upload)
                .fallback(unsupported),
        )
        .route(
            "/v2/templates/{id}/builds/{build}",
            post(start_build).fallback(unsupported),
        )
        .route(
            "/templates/{id}/builds/{build}/status",
            get(build_status).fallback(unsupported),
        )
        .route(
            "/templates/aliases/{alias}",
            get(alias).fallback(unsupported),
        )
        .route("/templates/{id}/tags", get(tags).fallback(unsupported))
        .route(
            "/templates/tags",
            post(assign_tags).delete(remove_tags).fallback(unsupported),
        )
        .route("/templates", get(list).fallback(unsupported))
}

/// One E2B build: requested, then started with its steps.
pub struct TemplateBuild {
    tenant: String,
    template: String,
    tags: Vec<String>,
    created_at: DateTime<Utc>,
    state: Mutex<Stage>,
}

impl TemplateBuild {
    /// Started and not yet tagged: its image is being made.
    fn under_way(&self) -> bool {
        matches!(*self.state.lock(), Stage::Started { tagged: false, .. })
    }
}

#[derive(Clone)]
enum Stage {
    /// Requested; its steps not given yet.
    Waiting,
    /// Running as this `koder-build` build; `tagged` once the image has all its tags.
    Started { build: String, tagged: bool },
    /// Refused before any step ran (its base, its steps).
    Refused(String),
}

/// What a tenant's templates may hold (`[e2b]` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateLimits {
    /// Images the tenant's template names may point at together: a build that would make one
    /// more is refused (`[e2b] max_template_images`).
    pub max_images: usize,
    /// A tenant's builds under way at once (`[e2b] max_template_builds`): the builder runs one
    /// build at a time, so this bounds how long one tenant's queue keeps everyone else's
    /// builds waiting; one more is 429, as E2B answers a team over its concurrent builds.
    pub max_under_way: usize,
    pub files: TemplateFiles,
}

impl Default for TemplateLimits {
    fn default() -> Self {
        Self {
            max_images: 100,
            max_under_way: 4,
            files: TemplateFiles::default(),
        }
    }
}

/// A template's name and tag as E2B writes them: `name` or `name:tag`.
fn split_name(name: &str) -> Result<(String, Option<String>), HttpError> {
    let (template, tag) = match name.split_once(':') {
        Some((t, tag)) => (t, Some(tag)),
        None => (name, None),
    };
    check_part(template, "template name")?;
    if let Some(tag) = tag {
        check_part(tag, "tag")?;
    }
    Ok((template.to_string(), tag.map(str::to_string)))
}

/// A template name or tag: what an image name's parts may be (lowercase letters, digits, `.`,
/// `_`, `-`, starting with a letter or digit), at most 64 characters.
fn check_part(part: &str, what: &str) -> Result<(), HttpError> {
    let ok = part.len() <= 64
        && part
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && part
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && !part.contains("..");
    if ok {
        Ok(())
    } else {
        Err(HttpError::bad_request(format!(
            "invalid {what} {part:?}: lowercase letters, digits, `.`, `_` and `-`, starting with a letter or digit, at most 64"
        )))
    }
}

/// A tag of an assign or remove: `tag`, or `name:tag` (both parts given).
fn tag_of(raw: &str) -> Result<String, HttpError> {
    let tag = match raw.split_once(':') {
        Some((name, tag)) if !name.is_empty() && !tag.is_empty() => tag,
        Some(_) => {
            return Err(HttpError::bad_request(format!(
                "invalid tag {raw:?}: `tag` or `name:tag`"
            )))
        }
        None => raw,
    };
    check_part(tag, "tag")?;
    Ok(tag.to_string())
}

/// The store's name prefix of the tenant's template `template` (`...:` with the tag after).
fn image_prefix(e2b: &E2b, who: &Identity, template: &str) -> String {
    format!("{}{template}:", tenant_prefix(e2b, who))
}

/// What every image name of the tenant's templates starts with.
fn tenant_prefix(e2b: &E2b, who: &Identity) -> String {
    format!("e2b.{}.", e2b.template_namespace(&who.tenant_id))
}

fn store(e2b: &E2b) -> Result<ImageStore, HttpError> {
    e2b.manager()
        .image_store()
        .cloned()
        .ok_or_else(|| HttpError::new(501, "this server has no image store: no template builds"))
}

fn image_error(e: koder_image::ImageError) -> HttpError {
    koder_http::image_api_error(e).into()
}

/// The tenant's tags of `template`: (tag, image digest), sorted by tag (in a cluster, made on
/// any node).
async fn template_tags(
    e2b: &E2b,
    who: &Identity,
    template: &str,
) -> Result<Vec<(String, String)>, HttpError> {
    let prefix = image_prefix(e2b, who, template);
    Ok(e2b
        .manager()
        .image_names_with_prefix(&prefix)
        .await?
        .into_iter()
        .map(|(name, digest)| (name[prefix.len()..].to_string(), digest))
        .collect())
}

/// The image name `Sandbox.create(template)` means, when it names a template of the tenant.
pub async fn template_image(
    e2b: &E2b,
    who: &Identity,
    template: &str,
) -> Result<Option<String>, HttpError> {
    let Some(image) = template_image_name(e2b, who, template) else {
        return Ok(None);
    };
    // Built on another node of a cluster, it is fetched here first.
    e2b.manager().sync_image(&image).await?;
    Ok(local_template_image(e2b, image))
}

/// The image name of the tenant's template `template` (`name` or `name:tag`).
fn template_image_name(e2b: &E2b, who: &Identity, template: &str) -> Option<String> {
    let (name, tag) = split_name(template).ok()?;
    Some(format!(
        "{}{}",
        image_prefix(e2b, who, &name),
        tag.as_deref().unwrap_or(DEFAULT_TAG)
    ))
}

/// `image` when this node's store has it.
fn local_template_image(e2b: &E2b, image: String) -> Option<String> {
    let store = e2b.manager().image_store()?;
    matches!(store.digest_of_name(&image), Ok(Some(_))).then_some(image)
}

/// The template a session on `image` answers to: its name, for a template's image.
pub fn template_of_image(image: &str) -> Option<&str> {
    let rest = image.strip_prefix("e2b.")?;
    let (_, named) = rest.split_once('.')?;
    Some(named.split_once(':').map_or(named, |(name, _)| name))
}

/// A build id the SDK reads as a UUID, for an image: its digest's first half.
fn build_id_of(digest: &str) -> String {
    let bytes = hex::decode(digest.get(..32).unwrap_or_default()).unwrap_or_default();
    uuid::Uuid::from_slice(&bytes)
        .unwrap_or_default()
        .to_string()
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RequestBuild {
    name: Option<String>,
    alias: Option<String>,
    tags: Option<Vec<String>>,
    #[serde(rename = "teamID")]
    team_id: Option<String>,
    cpu_count: Option<u32>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<u32>,
}

/// `POST /v3/templates {name, tags?, cpuCount?, memoryMB?}` → 202: a build id; nothing runs
/// until its steps come. CPU and memory are the server's session limits here.
async fn request_build(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    raw: Body,
) -> Result<Response, HttpError> {
    let req: RequestBuild = body(raw).await?;
    let _ = (req.team_id, req.cpu_count, req.memory_mb);
    store(&e2b)?;
    let name = req
        .name
        .or(req.alias)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| HttpError::bad_request("name is required"))?;
    let (template, tag) = split_name(&name)?;
    if TEMPLATES.iter().any(|(t, _)| *t == template) {
        return Err(HttpError::bad_request(format!(
            "{template:?} is a built-in template of koder-sandbox; choose another name"
        )));
    }
    let mut tags = vec![tag.unwrap_or_else(|| DEFAULT_TAG.into())];
    for t in req.tags.unwrap_or_default() {
        let t = tag_of(&t)?;
        if !tags.contains(&t) {
            tags.push(t);
        }
    }
    let build_id = uuid::Uuid::new_v4().to_string();
    let build = Arc::new(TemplateBuild {
        tenant: who.tenant_id.clone(),
        template: template.clone(),
        tags: tags.clone(),
        created_at: Utc::now(),
        state: Mutex::new(Stage::Waiting),
    });
    {
        let mut builds = e2b.template_builds().lock();
        forget_old_builds(&mut builds, &who.tenant_id);
        builds.insert(build_id.clone(), build);
    }
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({
            "templateID": template,
            "buildID": build_id,
            "public": false,
            "names": [template],
            "aliases": [template],
            "tags": tags,
        })),
    )
        .into_response())
}

/// Requested builds kept, all tenants' (the oldest dropped beyond).
const KEPT_BUILDS: usize = 1000;
/// Requested builds kept of one tenant: its requests make room among its own builds first, so
/// one tenant's stream of requests cannot push everyone else's builds out of sight.
const KEPT_PER_TENANT: usize = 100;

/// Makes room for one more build of `tenant`: drops its oldest beyond [`KEPT_PER_TENANT`], then
/// anyone's oldest beyond [`KEPT_BUILDS`]; never a build under way (its tenant's bound counts
/// it, and it must stay in sight to be tagged and followed).
fn forget_old_builds(builds: &mut HashMap<String, Arc<TemplateBuild>>, tenant: &str) {
    let forget_oldest = |builds: &mut HashMap<String, Arc<TemplateBuild>>, only: Option<&str>| {
        let oldest = builds
            .iter()
            .filter(|(_, b)| only.is_none_or(|t| b.tenant == t) && !b.under_way())
            .min_by_key(|(_, b)| b.created_at)
            .map(|(id, _)| id.clone());
        oldest.is_some_and(|id| builds.remove(&id).is_some())
    };
    let of_tenant = |builds: &HashMap<String, Arc<TemplateBuild>>| {
        builds.values().filter(|b| b.tenant == tenant).count()
    };
    while of_tenant(builds) >= KEPT_PER_TENANT && forget_oldest(builds, Some(tenant)) {}
    while builds.len() >= KEPT_BUILDS && forget_oldest(builds, None) {}
}

/// The tenant's build `id` of `template`; another tenant's answers as unknown.
fn build_of(
    e2b: &E2b,
    who: &Identity,
    template: &str,
    id: &str,
) -> Result<Arc<TemplateBuild>, HttpError> {
    e2b.template_builds()
        .lock()
        .get(id)
        .filter(|b| b.tenant == who.tenant_id && b.template == template)
        .cloned()
        .ok_or_else(|| {
            HttpError::not_found(format!("build {id:?} of template {template:?} not found"))
        })
}

/// `POST /v2/templates/{id}/builds/{build}` with the steps → 202: the build runs.
async fn start_build(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path((template, id)): Path<(String, String)>,
    raw: Body,
) -> Result<StatusCode, HttpError> {
    let req: StartBuild = body(raw).await?;
    let build = build_of(&e2b, &who, &template, &id)?;
    sync_base(&e2b, &who, &req).await?;
    // The tenant's template names, on every node: what its bound on images counts.
    let names = e2b
        .manager()
        .image_names_with_prefix(&tenant_prefix(&e2b, &who))
        .await?;
    let started = {
        // One admission at a time: a build started twice at once runs once, and racing
        // starts cannot pass the tenant's bounds together (each counts the others' builds).
        let _admitting = e2b.template_room().lock();
        if !matches!(*build.state.lock(), Stage::Waiting) {
            return Err(HttpError::new(
                409,
                format!("build {id} was started already"),
            ));
        }
        admit(&e2b, &who, &template, &build, &req, &names)?
    };
    tokio::spawn(tag_when_built(e2b.clone(), who, build, started));
    Ok(StatusCode::ACCEPTED)
}

/// Brings the build's base here when another node of the cluster made it (a template of
/// the tenant's, an imported image): the admission that follows reads this node's store.
async fn sync_base(e2b: &E2b, who: &Identity, req: &StartBuild) -> Result<(), HttpError> {
    match (req.from_template.as_deref(), req.from_image.as_deref()) {
        (Some(t), None) if template_language(t).is_err() => {
            template_image(e2b, who, t).await?;
        }
        (None, Some(image)) => e2b.manager().sync_image(image).await?,
        _ => {}
    }
    Ok(())
}

/// Submits the waiting `build` once the tenant has room for it; the native build's id.
fn admit(
    e2b: &E2b,
    who: &Identity,
    template: &str,
    build: &TemplateBuild,
    req: &StartBuild,
    names: &[(String, String)],
) -> Result<String, HttpError> {
    check_room(e2b, who, build, names)?;
    let planned = base_of(e2b, who, req).and_then(|base| {
        let dir = files::dir(e2b, who)?;
        let policy = e2b.template_limits().files;
        steps::plan(base, req, |hash| files::find(&dir, hash, &policy))
    });
    let plan = match planned {
        Ok(plan) => plan,
        Err(e) => {
            *build.state.lock() = Stage::Refused(e.message.clone());
            return Err(e);
        }
    };
    let first = format!("{}{}", image_prefix(e2b, who, template), build.tags[0]);
    let builds = &e2b.app().builds;
    let started = builds
        .submit_plan(plan, &first, &who.tenant_id)
        .map_err(|e| {
            HttpError::new(
                koder_http::status_of(e.code()),
                format!("{}: {e}", e.code()),
            )
        })?;
    *build.state.lock() = Stage::Started {
        build: started.build_id.clone(),
        tagged: false,
    };
    Ok(started.build_id)
}

/// Refuses a build while `max_under_way` of the tenant's are (429), and one whose image
/// would be one more than the tenant's template names may point at (403): the images its
/// names point at once this build moved its tags, and one for each of its other builds under
/// way (each makes one).
fn check_room(
    e2b: &E2b,
    who: &Identity,
    build: &TemplateBuild,
    names: &[(String, String)],
) -> Result<(), HttpError> {
    let prefix = image_prefix(e2b, who, &build.template);
    let moved: Vec<String> = build.tags.iter().map(|t| format!("{prefix}{t}")).collect();
    let kept: HashSet<&str> = names
        .iter()
        .filter(|(name, _)| !moved.contains(name))
        .map(|(_, digest)| digest.as_str())
        .collect();
    let under_way = e2b
        .template_builds()
        .lock()
        .values()
        .filter(|b| b.tenant == who.tenant_id && !std::ptr::eq(&***b, build))
        .filter(|b| b.under_way())
        .count();
    let limits = e2b.template_limits();
    if under_way >= limits.max_under_way {
        return Err(HttpError::new(
            429,
            format!(
                "{under_way} builds of the tenant's templates are under way, the most at once: \
                 start this one once one of them ended"
            ),
        ));
    }
    let max = limits.max_images;
    if kept.len() + under_way < max {
        return Ok(());
    }
    Err(HttpError::new(
        403,
        format!(
            "the tenant's templates hold {} images and {under_way} more are being built, the \
             most this server allows ({max}): delete a template or a tag first",
            kept.len()
        ),
    ))
}

/// The base image of a build: `fromTemplate` (a built-in template's image, or one of the
/// tenant's templates) or `fromImage` (E2B's base image is the `base` template; any other an
/// image of the store, by name).
fn base_of(e2b: &E2b, who: &Identity, req: &StartBuild) -> Result<StoredImage, HttpError> {
    if req
        .from_image_registry
        .as_ref()
        .is_some_and(|r| !r.is_null())
    {
        return Err(HttpError::bad_request(
            "fromImageRegistry: koder-sandbox reaches no registry; import the image (POST /v1/sandbox/images/import) and name it in fromImage",
        ));
    }
    let builds = &e2b.app().builds;
    let found = |name: &str| {
        builds
            .base(name)
            .map_err(|e| HttpError::bad_request(e.to_string()))
    };
    let builtin = |language: &str| {
        let image = e2b.manager().language_image(language);
        if image == HOST {
            return Err(HttpError::bad_request(format!(
                "the {language} template runs on the host image, which builds cannot start from; an operator maps it to a language pack ([images] language_packs)"
            )));
        }
        found(&image)
    };
    match (req.from_template.as_deref(), req.from_image.as_deref()) {
        (Some(t), None) => match template_language(t) {
            Ok(language) => builtin(language),
            Err(_) => match template_image_name(e2b, who, t)
                .and_then(|image| local_template_image(e2b, image))
            {
                Some(image) => found(&image),
                None => Err(HttpError::bad_request(format!(
                    "fromTemplate: template {t:?} not found"
                ))),
            },
        },
        (None, Some(image)) => {
            let bare = image.strip_suffix(":latest").unwrap_or(image);
            if bare == E2B_BASE_IMAGE {
                builtin(template_language("base")?)
            } else {
                found(image).map_err(|e| {
                    HttpError::bad_request(format!(
                        "fromImage: {}; koder-sandbox reaches no registry: an operator imports images (`ksandbox image import`, POST /v1/sandbox/images/import) under the name templates give",
                        e.message
                    ))
                })
            }
        }
        (Some(_), Some(_)) => Err(HttpError::bad_request(
            "give fromTemplate or fromImage, not both",
        )),
        (None, None) => Err(HttpError::bad_request(
            "fromTemplate or fromImage is required",
        )),
    }
}

/// Follows a build to its end; a built image gets its other tags.
async fn tag_when_built(e2b: E2b, who: Identity, build: Arc<TemplateBuild>, id: String) {
    let done = finished(&e2b.app().builds, &id).await;
    if let Some(done) = done.filter(|d| d.state == BuildState::Succeeded) {
        if let (Ok(store), Some(digest)) = (store(&e2b), done.digest.as_deref()) {
            let prefix = image_prefix(&e2b, &who, &build.template);
            for tag in &build.tags[1..] {
                let name = format!("{prefix}{tag}");
                if let Err(e) = store.set_name(&name, digest) {
                    tracing::warn!(error = %e, template = %build.template, "tagging a template");
                } else if let Err(e) = e2b.manager().publish_image(&name).await {
                    tracing::warn!(error = %e, template = %build.template, "sharing a template's tag");
                }
            }
        }
    }
    if let Stage::Started { tagged, .. } = &mut *build.state.lock() {
        *tagged = true;
    }
}

/// The build's final status, once it ends.
async fn finished(builds: &koder_build::Builds, id: &str) -> Option<Build> {
    let follow = builds.follow(id).await.ok()?;
    if let Some(done) = follow.done {
        return Some(*done);
    }
    let mut live = follow.live?;
    loop {
        match live.recv().await {
            Ok(LogEvent::Done(done)) => return Some(*done),
            Ok(LogEvent::Line(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                return builds
                    .get(id)
                    .await
                    .ok()
                    .filter(|b| b.finished_at.is_some())
            }
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct StatusQuery {
    logs_offset: Option<usize>,
    limit: Option<usize>,
    level: Option<String>,
}

/// `GET /templates/{id}/builds/{build}/status?logsOffset&limit` → `TemplateBuildInfo`: the
/// build's state and its log lines from `logsOffset` (at most `limit`, 100).
async fn build_status(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path((template, id)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> Result<axum::Json<Value>, HttpError> {
    let _ = q.level;
    let build = build_of(&e2b, &who, &template, &id)?;
    let builds = &e2b.app().builds;
    let stage = build.state.lock().clone();
    let (status, lines, reason) = match stage {
        Stage::Waiting => ("waiting", Vec::new(), None),
        Stage::Refused(why) => (
            "error",
            Vec::new(),
            Some(json!({"message": why, "step": "base"})),
        ),
        Stage::Started { build: bid, tagged } => {
            let b = builds
                .get(&bid)
                .await
                .map_err(|e| HttpError::not_found(e.to_string()))?;
            let lines = builds.log_lines(&bid).await.unwrap_or_default();
            match b.state {
                BuildState::Failed => {
                    let message = b
                        .error
                        .map(|e| e.message)
                        .unwrap_or_else(|| "build failed".into());
                    let mut reason = json!({"message": message});
                    if let Some(step) = b.failed_step {
                        reason["step"] = (step + 1).to_string().into();
                    }
                    ("error", lines, Some(reason))
                }
                BuildState::Succeeded if tagged => ("ready", lines, None),
                // Queued behind another build or running: once started, E2B says building
                // (its SDK's background builds check for it right after the start).
                _ => ("building", lines, None),
            }
        }
    };
    let from = q.logs_offset.unwrap_or(0).min(lines.len());
    let to = from
        + q.limit
            .unwrap_or(LOG_PAGE)
            .min(LOG_PAGE)
            .min(lines.len() - from);
    let page = &lines[from..to];
    let now = time(Utc::now());
    let entries: Vec<Value> = page
        .iter()
        .map(|l| json!({"timestamp": now, "level": "info", "message": l}))
        .collect();
    let mut v = json!({
        "templateID": template,
        "buildID": id,
        "status": status,
        "logs": page,
        "logEntries": entries,
    });
    if let Some(reason) = reason {
        v["reason"] = reason;
    }
    Ok(axum::Json(v))
}

/// `GET /templates/aliases/{alias}` → `{templateID, public}`: a built-in template, or one of
/// the tenant's; 404 otherwise.
async fn alias(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(alias): Path<String>,
) -> Result<axum::Json<Value>, HttpError> {
    if template_language(&alias).is_ok() {
        return Ok(axum::Json(json!({"templateID": alias, "public": true})));
    }
    let (template, _) = split_name(&alias).map_err(|_| not_found(&alias))?;
    if template_tags(&e2b, &who, &template).await?.is_empty() {
        return Err(not_found(&alias));
    }
    Ok(axum::Json(json!({"templateID": template, "public": false})))
}

fn not_found(template: &str) -> HttpError {
    HttpError::not_found(format!("template {template:?} not found"))
}

/// `GET /templates/{id}/tags` → `[{tag, buildID, createdAt}]`.
async fn tags(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(template): Path<String>,
) -> Result<axum::Json<Value>, HttpError> {
    let (template, _) = split_name(&template).map_err(|_| not_found(&template))?;
    let tags = template_tags(&e2b, &who, &template).await?;
    if tags.is_empty() {
        return Err(not_found(&template));
    }
    let mut out = Vec::with_capacity(tags.len());
    for (tag, digest) in &tags {
        let built = e2b.manager().image_build(digest).await?;
        let created = built.map_or_else(Utc::now, |i| i.manifest.created_at);
        out.push(json!({"tag": tag, "buildID": build_id_of(digest), "createdAt": time(created)}));
    }
    Ok(axum::Json(Value::Array(out)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AssignTags {
    target: String,
    tags: Vec<String>,
}

/// `POST /templates/tags {target: "name:tag", tags}` → 201 `{tags, buildID}`: the target's
/// image under more tags.
async fn assign_tags(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    raw: Body,
) -> Result<Response, HttpError> {
    let req: AssignTags = body(raw).await?;
    let (template, tag) = split_name(&req.target)?;
    let tags = req
        .tags
        .iter()
        .map(|t| tag_of(t))
        .collect::<Result<Vec<_>, _>>()?;
    if tags.is_empty() {
        return Err(HttpError::bad_request("tags is empty"));
    }
    let store = store(&e2b)?;
    let prefix = image_prefix(&e2b, &who, &template);
    let target = format!("{prefix}{}", tag.as_deref().unwrap_or(DEFAULT_TAG));
    e2b.manager().sync_image(&target).await?;
    let digest = store
        .digest_of_name(&target)
        .map_err(image_error)?
        .ok_or_else(|| not_found(&req.target))?;
    for t in &tags {
        let name = format!("{prefix}{t}");
        store.set_name(&name, &digest).map_err(image_error)?;
        e2b.manager().publish_image(&name).await?;
    }
    Ok((
        StatusCode::CREATED,
        axum::Json(json!({"tags": tags, "buildID": build_id_of(&digest)})),
    )
        .into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RemoveTags {
    name: String,
    tags: Vec<String>,
}

/// `DELETE /templates/tags {name, tags}` → 204; a tag the template does not have is 404.
async fn remove_tags(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    raw: Body,
) -> Result<StatusCode, HttpError> {
    let req: RemoveTags = body(raw).await?;
    let (template, _) = split_name(&req.name)?;
    let tags = req
        .tags
        .iter()
        .map(|t| tag_of(t))
        .collect::<Result<Vec<_>, _>>()?;
    let existing = template_tags(&e2b, &who, &template).await?;
    if let Some(missing) = tags.iter().find(|t| !existing.iter().any(|(e, _)| e == *t)) {
        return Err(HttpError::not_found(format!(
            "template {template:?} has no tag {missing:?}"
        )));
    }
    let store = store(&e2b)?;
    let prefix = image_prefix(&e2b, &who, &template);
    for t in &tags {
        let name = format!("{prefix}{t}");
        store.unname(&name).map_err(image_error)?;
        e2b.manager().unpublish_image(&name).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Removes every tag of the tenant's template `template`; whether it had any. The images go
/// with the store's garbage collection, unless named otherwise (another tenant's identical
/// build shares them).
pub async fn remove(e2b: &E2b, who: &Identity, template: &str) -> Result<bool, HttpError> {
    let Ok((template, _)) = split_name(template) else {
        return Ok(false);
    };
    let tags = template_tags(e2b, who, &template).await?;
    let store = store(e2b)?;
    let prefix = image_prefix(e2b, who, &template);
    for (tag, _) in &tags {
        let name = format!("{prefix}{tag}");
        store.unname(&name).map_err(image_error)?;
        e2b.manager().unpublish_image(&name).await?;
    }
    Ok(!tags.is_empty())
}

/// `GET /templates` → the built-in templates and the tenant's.
async fn list(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
) -> Result<axum::Json<Value>, HttpError> {
    let mut out: Vec<Value> = TEMPLATES
        .iter()
        .map(|(t, _)| template_json(t, true, &[], None))
        .collect();
    if store(&e2b).is_ok() {
        let prefix = tenant_prefix(&e2b, &who);
        let names = e2b.manager().image_names_with_prefix(&prefix).await?;
        let mut by_template: std::collections::BTreeMap<String, Vec<(String, String)>> =
            Default::default();
        for (name, digest) in names {
            if let Some((template, tag)) = name[prefix.len()..].split_once(':') {
                by_template
                    .entry(template.to_string())
                    .or_default()
                    .push((tag.to_string(), digest));
            }
        }
        for (template, tags) in by_template {
            let image = e2b.manager().image_build(&tags[0].1).await?;
            out.push(template_json(&template, false, &tags, image.as_ref()));
        }
    }
    Ok(axum::Json(Value::Array(out)))
}

/// `Template` of E2B's listing.
fn template_json(
    template: &str,
    public: bool,
    tags: &[(String, String)],
    image: Option<&StoredImage>,
) -> Value {
    let created = image.map_or_else(Utc::now, |i| i.manifest.created_at);
    let digest = tags.first().map(|(_, d)| d.as_str()).unwrap_or_default();
    json!({
        "templateID": template,
        "buildID": build_id_of(digest),
        "cpuCount": 1,
        "memoryMB": 512,
        "diskSizeMB": image.map_or(0, |i| i.manifest.size_bytes >> 20),
        "public": public,
        "aliases": [template],
        "names": [template],
        "createdAt": time(created),
        "updatedAt": time(created),
        "createdBy": null,
        "lastSpawnedAt": null,
        "spawnCount": 0,
        "buildCount": tags.len(),
        "envdVersion": super::ENVD_VERSION,
        "buildStatus": "ready",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_tags_and_images() {
        assert_eq!(
            split_name("e2b-test:v1-0af3").unwrap(),
            ("e2b-test".into(), Some("v1-0af3".into()))
        );
        assert_eq!(split_name("app").unwrap(), ("app".into(), None));
        for bad in ["", "App", "a:b:c", "../x", "a/b", ":tag", "name:", "-x"] {
            assert!(split_name(bad).is_err(), "{bad}");
        }
        assert_eq!(tag_of("stable").unwrap(), "stable");
        assert_eq!(tag_of("app:v2").unwrap(), "v2");
        for bad in [":invalid-tag", "app:", "Bad"] {
            assert!(tag_of(bad).is_err(), "{bad}");
        }
        assert_eq!(template_of_image("e2b.0123abcd.app:v1"), Some("app"));
        assert_eq!(template_of_image("python"), None);
        let id = build_id_of(&"ab".repeat(32));
        assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
    }

    fn requested(tenant: &str, age_s: i64, stage: Stage) -> Arc<TemplateBuild> {
        Arc::new(TemplateBuild {
            tenant: tenant.into(),
            template: "t".into(),
            tags: vec![DEFAULT_TAG.into()],
            created_at: Utc::now() - chrono::Duration::seconds(age_s),
            state: Mutex::new(stage),
        })
    }

    #[test]
    fn a_tenants_requests_make_room_among_its_own_builds_and_never_drop_one_under_way() {
        let mut builds = HashMap::new();
        let running = || Stage::Started {
            build: "b".into(),
            tagged: false,
        };
        // Another tenant's old build, then a flood of one tenant's requests, its oldest running.
        builds.insert(
            "theirs".to_string(),
            requested("t2", 10_000, Stage::Waiting),
        );
        builds.insert("running".to_string(), requested("t1", 9_000, running()));
        for i in 0..KEPT_PER_TENANT * 3 {
            forget_old_builds(&mut builds, "t1");
            let age = 5_000 - i64::try_from(i).unwrap();
            builds.insert(format!("r{i}"), requested("t1", age, Stage::Waiting));
        }
        let mine = builds.values().filter(|b| b.tenant == "t1").count();
        assert_eq!(mine, KEPT_PER_TENANT);
        assert!(builds.contains_key("theirs") && builds.contains_key("running"));
        let last = format!("r{}", KEPT_PER_TENANT * 3 - 1);
        assert!(builds.contains_key(&last) && !builds.contains_key("r0"));
        // At the overall bound the oldest of anyone's goes, a build under way never.
        for i in 0..KEPT_BUILDS {
            builds.insert(
                format!("x{i}"),
                requested(&format!("x{i}"), 1, Stage::Waiting),
            );
        }
        forget_old_builds(&mut builds, "t3");
        assert_eq!(builds.len(), KEPT_BUILDS - 1);
        assert!(!builds.contains_key("theirs") && builds.contains_key("running"));
    }
}
