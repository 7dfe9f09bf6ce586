//! The E2B control plane: sandboxes are sessions of the caller's tenant, authenticated by
//! `X-API-KEY` with the same keys (and so the same tenancy) as the native API. Both SDK
//! generations are served: `/sandboxes...` and `/v2/sandboxes...`.

pub mod cpu;
pub mod keys;
mod logs;
mod page;
mod secrets;
mod snapshots;
pub mod templates;
mod volumes;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use chrono::{DateTime, SecondsFormat, Utc};
use koder_api_types::{
    CreateSession, Lifecycle, Network, NetworkMode, OnTimeout, Session, SessionState,
    VolumeMountRequest,
};
use koder_auth::Identity;
use koder_sessions::HeaderRules;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use cpu::CpuSample;
use keys::ApiCaller;

use crate::error::HttpError;
use crate::state::E2b;

/// What envd version the SDK is told: 0.6.4 unlocks every feature the SDK gates on a version
/// (stdin control, octet-stream uploads, recursive watch, entry info in watch events).
pub const ENVD_VERSION: &str = "0.6.4";

const MAX_BODY: usize = 1 << 20;
/// E2B's legacy `clientID` field; there is one "client" here, this daemon.
const CLIENT_ID: &str = "koder-sandbox";

/// E2B templates and the session languages they are: `base` is the bash image (which has
/// python3 and node), `code-interpreter-v1` the Python one with its interpreter.
pub const TEMPLATES: &[(&str, &str)] = &[
    ("base", "bash"),
    ("code-interpreter-v1", "python"),
    ("code-interpreter", "python"),
];

pub fn template_language(template: &str) -> Result<&'static str, HttpError> {
    TEMPLATES
        .iter()
        .find(|(t, _)| *t == template)
        .map(|(_, l)| *l)
        .ok_or_else(|| {
            HttpError::bad_request(format!(
                "template {template:?} not found; koder-sandbox has the templates base and code-interpreter-v1, and those the tenant built"
            ))
        })
}

/// The template a session answers to: a template's on its image, otherwise (sessions made
/// natively too) its language's.
pub fn session_template(s: &Session) -> &str {
    templates::template_of_image(&s.image).unwrap_or_else(|| template_of(&s.language))
}

/// The built-in template of a language.
pub fn template_of(language: &str) -> &str {
    match language {
        "bash" => "base",
        "python" => "code-interpreter-v1",
        other => other,
    }
}

pub fn router() -> Router<E2b> {
    Router::new()
        .route(
            "/sandboxes",
            post(create).get(list_v1).fallback(unsupported),
        )
        .route(
            "/v2/sandboxes",
            post(create).get(list_v2).fallback(unsupported),
        )
        .route(
            "/sandboxes/{id}",
            get(info).delete(kill).fallback(unsupported),
        )
        .route(
            "/sandboxes/{id}/timeout",
            post(set_timeout).fallback(unsupported),
        )
        .route(
            "/sandboxes/{id}/network",
            axum::routing::put(set_network).fallback(unsupported),
        )
        .route(
            "/sandboxes/{id}/refreshes",
            post(refresh).fallback(unsupported),
        )
        .route("/sandboxes/{id}/pause", post(pause).fallback(unsupported))
        .route(
            "/sandboxes/{id}/snapshots",
            post(snapshots::create).fallback(unsupported),
        )
        .route(
            "/sandboxes/{id}/fork",
            post(snapshots::fork).fallback(unsupported),
        )
        .route("/snapshots", get(snapshots::list).fallback(unsupported))
        .route(
            "/templates/{id}",
            axum::routing::delete(snapshots::delete_template).fallback(unsupported),
        )
        // koder-sandbox extension (E2B has no such call): see docs/API-ADDITIONS.md.
        .route(
            "/sandboxes/{id}/kill-processes",
            post(kill_processes).fallback(unsupported),
        )
        .route("/sandboxes/{id}/resume", post(resume).fallback(unsupported))
        .route(
            "/sandboxes/{id}/connect",
            post(connect).fallback(unsupported),
        )
        .route(
            "/v2/sandboxes/{id}/connect",
            post(connect).fallback(unsupported),
        )
        .route(
            "/sandboxes/{id}/metrics",
            get(metrics).fallback(unsupported),
        )
        .merge(logs::routes())
        .merge(volumes::routes())
        .merge(secrets::routes())
        .merge(templates::routes())
        // The rest of E2B's API (legacy template builds, team calls...) answers in
        // E2B's error shape too: the native 404 body would crash the SDK.
        .fallback(unsupported)
}

/// Paths of E2B's API, served by this router rather than the native one.
pub fn is_control_path(path: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "/sandboxes",
        "/v2/sandboxes",
        "/templates",
        "/v2/templates",
        "/v3/templates",
        "/snapshots",
        "/volumes",
        "/volumecontent",
        "/secrets",
        "/teams",
    ];
    PREFIXES.iter().any(|p| {
        path.strip_prefix(p)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

async fn unsupported(method: axum::http::Method, uri: axum::http::Uri) -> HttpError {
    HttpError::new(
        501,
        format!(
            "{method} {} is not supported by koder-sandbox's E2B API (sandboxes: create, connect, list, info, timeout, pause, resume, snapshots, fork, metrics, logs, kill; snapshots: list, delete; templates: build (v3/v2), files, status, aliases, tags, list, delete; volumes and their content; secrets)",
            uri.path()
        ),
    )
}

/// A JSON body in E2B's error shape when malformed; an empty body is the default value.
async fn body<T: DeserializeOwned + Default>(body: Body) -> Result<T, HttpError> {
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| HttpError::new(413, format!("request body larger than {MAX_BODY} bytes")))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| HttpError::bad_request(format!("invalid request body: {e}")))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    auto_pause: Option<bool>,
    auto_pause_memory: Option<bool>,
    auto_resume: Option<AutoResume>,
    #[serde(rename = "allow_internet_access", alias = "allowInternetAccess")]
    allow_internet_access: Option<bool>,
    network: Option<NetworkRules>,
    mcp: Option<Value>,
    volume_mounts: Option<Vec<VolumeMountBody>>,
}

/// `SandboxVolumeMount`: E2B names the volume (its name, as `Volume.create` gave it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VolumeMountBody {
    name: String,
    path: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct NetworkRules {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    /// Whether the sandbox's ports answer by host name without its traffic access token
    /// (`crate::ports`); E2B's default is yes. Fixed at create.
    allow_public_traffic: Option<bool>,
    /// The `Host` those requests arrive with, `${PORT}` standing for the port. Fixed at create.
    mask_request_host: Option<String>,
    /// Per-host request transforms: headers set at egress (`koder_sessions::HeaderRules`).
    rules: Option<BTreeMap<String, Vec<RuleBody>>>,
}

/// `SandboxNetworkRule`: what is done to requests to its host.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RuleBody {
    transform: Option<TransformBody>,
}

/// `SandboxNetworkTransform`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct TransformBody {
    headers: Option<BTreeMap<String, String>>,
}

/// E2B's rules as header rules, hosts lower-cased as E2B stores them: a host's rules applied
/// in order, a later one's header taking the place of an earlier one's of the same name (any
/// case).
fn header_rules_of(rules: Option<BTreeMap<String, Vec<RuleBody>>>) -> HeaderRules {
    let mut out = HeaderRules::new();
    for (host, list) in rules.unwrap_or_default() {
        let headers = out.entry(host.to_ascii_lowercase()).or_default();
        let set = list
            .into_iter()
            .filter_map(|r| r.transform?.headers)
            .flatten();
        for (name, value) in set {
            headers.retain(|(n, _)| !n.eq_ignore_ascii_case(&name));
            headers.push((name, value));
        }
    }
    out
}

/// A `maskRequestHost` that, with any port in place of `${PORT}`, is a usable `Host` value.
fn mask_of(rules: Option<&NetworkRules>) -> Result<Option<String>, HttpError> {
    let Some(mask) = rules.and_then(|r| r.mask_request_host.clone()) else {
        return Ok(None);
    };
    let usable = !mask.is_empty()
        && mask.len() <= 253
        && !mask.contains('@')
        && mask
            .replace("${PORT}", "65535")
            .parse::<axum::http::uri::Authority>()
            .is_ok_and(|a| a.as_str().bytes().all(|b| b.is_ascii_graphic()));
    if !usable {
        return Err(HttpError::bad_request(
            "maskRequestHost must be a host name, optionally with a port (`${PORT}` for the sandbox port)",
        ));
    }
    Ok(Some(mask))
}

/// `SandboxNetworkUpdateConfig` of `PUT /sandboxes/{id}/network`: the whole egress
/// configuration, replaced at once (omitted lists are cleared).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct NetworkUpdate {
    #[serde(flatten)]
    lists: NetworkRules,
    #[serde(rename = "allow_internet_access", alias = "allowInternetAccess")]
    allow_internet_access: Option<bool>,
    egress_proxy: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AutoResume {
    enabled: bool,
}

/// E2B's `autoPause` / `autoPauseMemory` / `autoResume` as the session's lifecycle. As in E2B,
/// a pause on timeout keeps memory unless `autoPauseMemory` is `false` (then only the files
/// are kept, durably).
fn lifecycle_of(
    auto_pause: Option<bool>,
    auto_pause_memory: Option<bool>,
    auto_resume: Option<AutoResume>,
) -> Result<Option<Lifecycle>, HttpError> {
    let on_timeout = match auto_pause {
        Some(true) => OnTimeout::Pause,
        Some(false) | None => OnTimeout::Kill,
    };
    let auto_resume = auto_resume.is_some_and(|a| a.enabled);
    if auto_resume && on_timeout != OnTimeout::Pause {
        return Err(HttpError::bad_request(
            "autoResume needs autoPause: only a sandbox that pauses on timeout can resume",
        ));
    }
    if auto_pause.is_none() && !auto_resume {
        return Ok(None);
    }
    Ok(Some(Lifecycle {
        on_timeout,
        auto_resume,
        keep_memory: on_timeout == OnTimeout::Pause && auto_pause_memory != Some(false),
    }))
}

const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// E2B's network options in koder-sandbox terms. Internet access is off unless asked for
/// (E2B's default is on): `allow_internet_access: true` asks for mode `open`, `allowOut` for an
/// allowlist. In E2B an `allowOut` entry beats a `denyOut` one, so with an allowlist (which
/// denies everything else anyway) `denyOut` adds nothing; without one, `denyOut` entries are
/// the deny rules of mode `open`, and `0.0.0.0/0` (E2B's "all traffic") is mode `none`.
fn network_of(
    allow_internet: Option<bool>,
    rules: Option<NetworkRules>,
) -> Result<Network, HttpError> {
    let rules = rules.unwrap_or_default();
    let allow = rules.allow_out.unwrap_or_default();
    let deny = rules.deny_out.unwrap_or_default();
    if !allow.is_empty() {
        return Ok(Network {
            mode: NetworkMode::Allowlist,
            allow,
            deny: Vec::new(),
        });
    }
    // E2B's default is internet access, and E2B code relies on it (`pip install`); the SSRF
    // guard still keeps private and metadata ranges out of reach.
    if allow_internet == Some(false) || deny.iter().any(|d| d == ALL_TRAFFIC) {
        return Ok(Network::default());
    }
    Ok(Network {
        mode: NetworkMode::Open,
        allow: Vec::new(),
        deny,
    })
}

/// `PUT /sandboxes/{id}/network`: the running sandbox's egress rules replaced, effective for
/// its next connection.
async fn set_network(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
    raw: Body,
) -> Result<StatusCode, HttpError> {
    let req: NetworkUpdate = body(raw).await?;
    if req.egress_proxy.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(HttpError::bad_request(
            "egressProxy is not supported: koder-sandbox dials egress from its own host",
        ));
    }
    if req.lists.allow_public_traffic.is_some() || req.lists.mask_request_host.is_some() {
        return Err(HttpError::bad_request(
            "allowPublicTraffic and maskRequestHost are fixed when the sandbox is created",
        ));
    }
    live_session(&e2b, &who, &id).await?;
    let mut lists = req.lists;
    let rules = header_rules_of(lists.rules.take());
    let network = network_of(req.allow_internet_access, Some(lists))?;
    e2b.manager()
        .set_network_and_rules(&who, &id, network, rules)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn create(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    raw: Body,
) -> Result<Response, HttpError> {
    let req: NewSandbox = body(raw).await?;
    let template = if req.template_id.is_empty() {
        "base".to_string()
    } else {
        req.template_id
    };
    // A template of the tenant's names its image; a snapshot id stands for a template
    // (`Sandbox.create(snapshot_id)`).
    let (language, image, from_snapshot) = match template_language(&template) {
        Ok(language) => (Some(language.to_string()), None, None),
        Err(unknown) => match templates::template_image(&e2b, &who, &template).await? {
            Some(image) => (None, Some(image), None),
            None => match snapshots::snapshot_template(&e2b, &who, &template).await? {
                Some(snapshot) => (None, None, Some(snapshot)),
                None => return Err(unknown),
            },
        },
    };
    let lifecycle = lifecycle_of(req.auto_pause, req.auto_pause_memory, req.auto_resume)?;
    // The SDK itself starts `mcp-gateway` inside the sandbox after the create; the control
    // plane only checks the configuration's shape. An image without the gateway makes that
    // start fail, and the SDK kills the sandbox.
    if req
        .mcp
        .as_ref()
        .is_some_and(|m| !m.is_null() && !m.is_object())
    {
        return Err(HttpError::bad_request(
            "mcp must be an object of MCP server configurations",
        ));
    }
    let volumes = req
        .volume_mounts
        .unwrap_or_default()
        .into_iter()
        .map(|m| VolumeMountRequest {
            name: m.name,
            path: m.path,
            read_only: false,
        })
        .collect();
    let public_traffic = req
        .network
        .as_ref()
        .and_then(|n| n.allow_public_traffic)
        .unwrap_or(true);
    let mask = mask_of(req.network.as_ref())?;
    let mut network = req.network;
    let rules = header_rules_of(network.as_mut().and_then(|n| n.rules.take()));
    let session = e2b
        .manager()
        .create_ruled(
            &who,
            CreateSession {
                language,
                image,
                from_snapshot,
                lifecycle,
                network: Some(network_of(req.allow_internet_access, network)?),
                env: req.env_vars.unwrap_or_default(),
                timeout_s: req.timeout,
                metadata: req.metadata.unwrap_or_default(),
                volumes,
                ..Default::default()
            },
            rules,
        )
        .await?;
    let ctx = e2b.ctx(&session.id);
    ctx.public_traffic.store(public_traffic, Ordering::Relaxed);
    *ctx.mask_request_host.lock() = mask;
    Ok((
        StatusCode::CREATED,
        axum::Json(sandbox_json(&e2b, &session)),
    )
        .into_response())
}

/// `Sandbox`: what create and connect answer.
fn sandbox_json(e2b: &E2b, s: &Session) -> Value {
    json!({
        "templateID": session_template(s),
        "sandboxID": s.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": e2b.envd_token(&s.id),
        // The interpreter SDK authenticates its context calls with this one.
        "trafficAccessToken": e2b.envd_token(&s.id),
        "domain": e2b.domain(),
    })
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn cpu_count(s: &Session) -> u64 {
    match s.limits.cpu_millis {
        Some(m) => u64::from(m).div_ceil(1000).max(1),
        None => std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
    }
}

fn state_name(s: &Session) -> &'static str {
    if s.state == SessionState::Paused {
        "paused"
    } else {
        "running"
    }
}

/// `ListedSandbox`.
fn listed_json(s: &Session) -> Value {
    json!({
        "templateID": session_template(s),
        "alias": session_template(s),
        "sandboxID": s.id,
        "clientID": CLIENT_ID,
        "startedAt": time(s.created_at),
        "endAt": time(s.expires_at),
        "cpuCount": cpu_count(s),
        "memoryMB": s.limits.memory_mib.unwrap_or(0),
        "diskSizeMB": s.limits.disk_mib.unwrap_or(0),
        "state": state_name(s),
        "envdVersion": ENVD_VERSION,
        "metadata": s.metadata,
    })
}

/// `SandboxDetail`: the listing plus the access token and the network.
fn detail_json(e2b: &E2b, s: &Session) -> Value {
    let mut v = listed_json(s);
    v["envdAccessToken"] = e2b.envd_token(&s.id).into();
    v["trafficAccessToken"] = e2b.envd_token(&s.id).into();
    v["allowInternetAccess"] = (s.network.mode != NetworkMode::None).into();
    v["domain"] = e2b.domain().into();
    match s.network.mode {
        NetworkMode::Allowlist => {
            v["network"] = json!({"allowOut": s.network.allow, "denyOut": [ALL_TRAFFIC]});
        }
        NetworkMode::Open if !s.network.deny.is_empty() => {
            v["network"] = json!({"denyOut": s.network.deny});
        }
        _ => {}
    }
    v
}

/// The tenant's session while it is running or paused; an ended (or foreign) one is 404.
async fn live_session(e2b: &E2b, who: &Identity, id: &str) -> Result<Session, HttpError> {
    match e2b.manager().get(who, id).await {
        Ok(s) if !s.state.is_ended() => Ok(s),
        Ok(_) | Err(koder_sessions::Error::NotFound) => {
            Err(HttpError::not_found(format!("sandbox {id:?} not found")))
        }
        Err(e) => Err(e.into()),
    }
}

async fn info(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>, HttpError> {
    let s = live_session(&e2b, &who, &id).await?;
    Ok(axum::Json(detail_json(&e2b, &s)))
}

async fn kill(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    live_session(&e2b, &who, &id).await?;
    e2b.manager().destroy(&who, &id).await?;
    e2b.forget(&id);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TimeoutBody {
    timeout: Option<u64>,
    duration: Option<u64>,
}

async fn set_timeout(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
    raw: Body,
) -> Result<StatusCode, HttpError> {
    let req: TimeoutBody = body(raw).await?;
    let timeout = req
        .timeout
        .ok_or_else(|| HttpError::bad_request("timeout (seconds) is required"))?;
    live_session(&e2b, &who, &id).await?;
    if timeout == 0 {
        // E2B's "time out now": the lifecycle (kill or pause) happens at once.
        e2b.manager().expire_now(&who, &id).await?;
    } else {
        e2b.manager().set_timeout(&who, &id, timeout).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The legacy keep-alive: the sandbox lives `duration` seconds from now.
async fn refresh(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
    raw: Body,
) -> Result<StatusCode, HttpError> {
    let req: TimeoutBody = body(raw).await?;
    live_session(&e2b, &who, &id).await?;
    let duration = req.duration.unwrap_or(e2b.sessions_cfg().default_timeout_s);
    e2b.manager().set_timeout(&who, &id, duration).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PauseBody {
    memory: Option<bool>,
}

/// `{memory?}`: E2B's default, a full pause, keeps the processes (frozen in place; they do
/// not outlive the daemon); `memory: false` keeps the filesystem durably and ends them.
async fn pause(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
    raw: Body,
) -> Result<StatusCode, HttpError> {
    let req: PauseBody = body(raw).await?;
    let s = live_session(&e2b, &who, &id).await?;
    if s.state == SessionState::Paused {
        return Err(HttpError::new(
            409,
            format!("sandbox {id:?} is already paused"),
        ));
    }
    e2b.manager()
        .pause_session(&who, &id, req.memory.unwrap_or(true))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Kills every process of a running sandbox, keeping the sandbox: `{"killed": n}`.
async fn kill_processes(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>, HttpError> {
    live_session(&e2b, &who, &id).await?;
    let killed = e2b.manager().kill_processes(&who, &id).await?;
    Ok(axum::Json(json!({ "killed": killed })))
}

/// `connect` and `resume`: `memory: false` (the SDK's `on_resume="reboot"`) asks a paused
/// sandbox to boot afresh on its filesystem rather than carry on where it stopped.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ConnectBody {
    timeout: Option<u64>,
    memory: Option<bool>,
}

/// Resumes a paused sandbox and extends its life to at least `timeout` seconds from now;
/// whether it had to resume it.
async fn wake(
    e2b: &E2b,
    who: &Identity,
    id: &str,
    req: &ConnectBody,
) -> Result<(Session, bool), HttpError> {
    let mut s = live_session(e2b, who, id).await?;
    let resumed = s.state == SessionState::Paused;
    if resumed {
        if req.memory == Some(false) {
            // A memory pause goes to disk first, so the resume below boots from the disk.
            e2b.manager().pause_session(who, id, false).await?;
        }
        s = e2b.manager().resume(who, id).await?;
    }
    if let Some(timeout) = req.timeout {
        let wanted = Utc::now()
            + chrono::Duration::seconds(i64::try_from(timeout).unwrap_or(i64::MAX / 1000));
        // "The timeout only ever grows on connect" (E2B): a shorter one is left alone.
        if wanted > s.expires_at {
            s = e2b.manager().set_timeout(who, id, timeout).await?;
        }
    }
    Ok((s, resumed))
}

async fn connect(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
    raw: Body,
) -> Result<Response, HttpError> {
    let req: ConnectBody = body(raw).await?;
    let (s, resumed) = wake(&e2b, &who, &id, &req).await?;
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(sandbox_json(&e2b, &s))).into_response())
}

/// Legacy resume: 409 when the sandbox is not paused.
async fn resume(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
    raw: Body,
) -> Result<Response, HttpError> {
    let req: ConnectBody = body(raw).await?;
    let s = live_session(&e2b, &who, &id).await?;
    if s.state != SessionState::Paused {
        return Err(HttpError::new(409, format!("sandbox {id:?} is not paused")));
    }
    let (s, _) = wake(&e2b, &who, &id, &req).await?;
    Ok((StatusCode::CREATED, axum::Json(sandbox_json(&e2b, &s))).into_response())
}

/// Running and paused sandboxes matching the query, newest first (or `order=asc`).
async fn matching(
    e2b: &E2b,
    who: &Identity,
    params: &[(String, String)],
) -> Result<Vec<Session>, HttpError> {
    let mut states: Vec<String> = Vec::new();
    let mut wanted_meta: Vec<(String, String)> = Vec::new();
    let mut template = None;
    let mut asc = false;
    let mut started_after = None;
    for (k, v) in params {
        match k.as_str() {
            "state" => states.extend(v.split(',').map(|s| s.trim().to_string())),
            "metadata" => wanted_meta.extend(parse_metadata_query(v)?),
            "template" => template = Some(v.clone()),
            "order" => asc = v == "asc",
            "startedAfter" => started_after = Some(parse_time("startedAfter", v)?),
            _ => {}
        }
    }
    if let Some(bad) = states.iter().find(|s| *s != "running" && *s != "paused") {
        return Err(HttpError::bad_request(format!(
            "state {bad:?}: one of running, paused"
        )));
    }
    let mut out: Vec<Session> = e2b
        .manager()
        .list(who)
        .await?
        .into_iter()
        .filter(|s| !s.state.is_ended())
        .filter(|s| states.is_empty() || states.iter().any(|st| st == state_name(s)))
        .filter(|s| {
            wanted_meta
                .iter()
                .all(|(k, v)| s.metadata.get(k) == Some(v))
        })
        .filter(|s| template.as_deref().is_none_or(|t| t == session_template(s)))
        .filter(|s| started_after.is_none_or(|after| s.created_at >= after))
        .collect();
    out.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
    if asc {
        out.reverse();
    }
    Ok(out)
}

/// An RFC 3339 instant of a query parameter (the SDK sends Python's `isoformat()`).
fn parse_time(name: &str, v: &str) -> Result<DateTime<Utc>, HttpError> {
    DateTime::parse_from_rfc3339(v)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| HttpError::bad_request(format!("{name} {v:?} is no RFC 3339 time: {e}")))
}

/// The SDK sends `metadata` as a URL-encoded query string of its own (`k=v&k2=v2`) whose keys
/// and values it percent-encoded before: decoded as a query, then each key and value again.
fn parse_metadata_query(q: &str) -> Result<Vec<(String, String)>, HttpError> {
    let twice = |s: &str| percent_decode(&percent_decode(s)?);
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((twice(k)?, twice(v)?))
        })
        .collect()
}

/// One form-decoding pass: `+` is a space, `%XX` a byte, and the result must be UTF-8.
fn percent_decode(s: &str) -> Result<String, HttpError> {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| HttpError::bad_request("metadata: not UTF-8"))
}

async fn list_v1(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Query(params): Query<Vec<(String, String)>>,
) -> Result<axum::Json<Vec<Value>>, HttpError> {
    let all = matching(&e2b, &who, &params).await?;
    Ok(axum::Json(all.iter().map(listed_json).collect()))
}

/// One page of the listing (`limit`, `nextToken`; see `page`).
async fn list_v2(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Query(params): Query<Vec<(String, String)>>,
) -> Result<Response, HttpError> {
    let asc = params.iter().any(|(k, v)| k == "order" && v == "asc");
    let all = matching(&e2b, &who, &params).await?;
    let (items, next) = page::page(all, |s| page::key(s.created_at, &s.id), &params, asc)?;
    Ok(page::response(
        items.iter().map(listed_json).collect(),
        next,
    ))
}

/// `start`/`end` of a metrics query: unix seconds, both optional.
#[derive(Debug, Default)]
struct MetricsRange {
    start: Option<i64>,
    end: Option<i64>,
}

impl MetricsRange {
    fn parse(params: &[(String, String)]) -> Result<Self, HttpError> {
        let mut range = Self::default();
        for (k, v) in params {
            let slot = match k.as_str() {
                "start" => &mut range.start,
                "end" => &mut range.end,
                _ => continue,
            };
            *slot = Some(v.parse().map_err(|_| {
                HttpError::bad_request(format!("{k} {v:?} is no unix time in seconds"))
            })?);
        }
        Ok(range)
    }

    /// Whether a sample taken at unix second `at` falls in the range. The bounds have second
    /// precision and the SDK truncates `end`, so a sample up to a second after it still counts.
    fn holds(&self, at: i64) -> bool {
        self.start.is_none_or(|s| s <= at) && self.end.is_none_or(|e| at <= e.saturating_add(1))
    }
}

/// The sandbox's resource use now, as a one-sample series: CPU over the time since the
/// previous request (or since the start), memory and disk now. Page cache is not measured
/// per session, so `memCache` is 0. A paused sandbox has no samples, and a range that does not
/// hold the present holds none either (no history is kept).
async fn metrics(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
    Query(params): Query<Vec<(String, String)>>,
) -> Result<axum::Json<Vec<Value>>, HttpError> {
    let range = MetricsRange::parse(&params)?;
    let s = live_session(&e2b, &who, &id).await?;
    if s.state == SessionState::Paused || !range.holds(Utc::now().timestamp()) {
        return Ok(axum::Json(Vec::new()));
    }
    let m = e2b.manager().metrics_of(&who, &id).await?;
    let cpus = cpu_count(&s) as f64;
    let now = CpuSample::now(m.cpu_used_ms);
    let previous = e2b.swap_cpu_sample(&id, now);
    let since_start_ms = (Utc::now() - s.created_at).num_milliseconds().max(1) as f64;
    let pct = now.used_pct(previous, since_start_ms, cpus);
    let at = Utc::now();
    Ok(axum::Json(vec![json!({
        "timestamp": time(at),
        "timestampUnix": at.timestamp(),
        "cpuCount": cpus as u64,
        "cpuUsedPct": (pct * 100.0).round() / 100.0,
        "memUsed": m.memory_current_kib * 1024,
        "memTotal": m.memory_limit_kib.unwrap_or(0) * 1024,
        "memCache": 0,
        "diskUsed": m.disk_used_kib * 1024,
        "diskTotal": m.disk_total_kib * 1024,
    })]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_s_rules_apply_in_order_a_later_header_replacing_an_earlier() {
        let body: NetworkRules = serde_json::from_value(json!({
            "rules": {
                "api.example.com": [
                    {"transform": {"headers": {"Authorization": "Bearer a", "X-One": "1"}}},
                    {},
                    {"transform": {"headers": {"authorization": "Bearer b"}}},
                ],
                "*.example.org": [],
                "*.Example.ORG": [{"transform": {"headers": {"X-Two": "2"}}}],
            }
        }))
        .unwrap();
        let rules = header_rules_of(body.rules);
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            rules["api.example.com"],
            pairs(&[("X-One", "1"), ("authorization", "Bearer b")])
        );
        assert_eq!(rules["*.example.org"], pairs(&[("X-Two", "2")]));
        assert_eq!(rules.len(), 2);
        assert!(header_rules_of(None).is_empty());
        // A rule of another shape than E2B's is refused, not half read.
        assert!(serde_json::from_value::<NetworkRules>(
            json!({"rules": {"a.test": [{"transform": {"headers": {}}, "extra": 1}]}})
        )
        .is_err());
    }

    #[test]
    fn a_request_host_mask_must_make_a_host() {
        let rules = |m: &str| NetworkRules {
            mask_request_host: Some(m.into()),
            ..Default::default()
        };
        assert_eq!(mask_of(None).unwrap(), None);
        for ok in [
            "app.example",
            "app.example:${PORT}",
            "10.0.0.1:80",
            "${PORT}.x",
        ] {
            assert_eq!(mask_of(Some(&rules(ok))).unwrap().as_deref(), Some(ok));
        }
        let long = "a".repeat(254);
        for bad in ["", "a b", "u@host", "host/path", "h\r\nx: y", long.as_str()] {
            assert_eq!(
                mask_of(Some(&rules(bad))).unwrap_err().status,
                StatusCode::BAD_REQUEST,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn routes_do_not_overlap_and_paths_are_claimed() {
        // axum refuses overlapping routes when the router is built, not when it compiles.
        let _ = router();
        for mine in [
            "/sandboxes",
            "/v2/sandboxes/x/connect",
            "/templates/t",
            "/volumes",
        ] {
            assert!(is_control_path(mine), "{mine}");
        }
        for native in ["/v1/sandbox/sessions", "/sandboxesx", "/healthz", "/"] {
            assert!(!is_control_path(native), "{native}");
        }
    }

    #[test]
    fn metric_ranges() {
        let r = |start, end| MetricsRange { start, end };
        assert!(r(None, None).holds(100));
        assert!(r(Some(90), Some(100)).holds(100));
        assert!(
            r(Some(90), Some(100)).holds(101),
            "end is truncated by the SDK"
        );
        assert!(!r(Some(90), Some(100)).holds(102));
        assert!(!r(Some(101), None).holds(100));
        assert!(r(Some(i64::MIN), Some(i64::MAX)).holds(0));
        let q = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        assert_eq!(MetricsRange::parse(&q("end", "7")).unwrap().end, Some(7));
        for bad in ["x", "1.5", "", "99999999999999999999"] {
            assert!(MetricsRange::parse(&q("start", bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn query_times() {
        let t = parse_time("startedAfter", "2026-12-01T20:29:18.286000+00:00").unwrap();
        assert_eq!(t.timestamp_millis() % 1000, 286);
        assert!(parse_time("startedAfter", "yesterday").is_err());
    }

    #[test]
    fn templates_map_to_languages() {
        assert_eq!(template_language("base").unwrap(), "bash");
        assert_eq!(template_language("code-interpreter-v1").unwrap(), "python");
        let e = template_language("desktop").unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.message.contains("desktop"));
        assert_eq!(template_of("python"), "code-interpreter-v1");
    }

    #[test]
    fn metadata_query_as_the_sdk_sends_it() {
        // urlencode({quote("a b"): quote("c&d"), "k": "v"}), decoded once by the query parser.
        let got = parse_metadata_query("a%2520b=c%2526d&k=v").unwrap();
        assert_eq!(
            got,
            [
                ("a b".to_string(), "c&d".to_string()),
                ("k".into(), "v".into())
            ]
        );
        // A stray `%` stays as it is (as in WHATWG form decoding); bytes must be UTF-8.
        assert_eq!(
            parse_metadata_query("a=%zz").unwrap(),
            [("a".into(), "%zz".into())]
        );
        assert!(parse_metadata_query("a=%25ff").is_err());
    }

    #[test]
    fn lifecycle_from_the_create_body() {
        let parse = |body: &str| {
            let req: NewSandbox = serde_json::from_str(body).unwrap();
            lifecycle_of(req.auto_pause, req.auto_pause_memory, req.auto_resume)
        };
        assert_eq!(parse(r#"{"templateID":"base"}"#).unwrap(), None);
        assert_eq!(
            parse(r#"{"templateID":"base","autoPause":false}"#).unwrap(),
            Some(Lifecycle::default())
        );
        assert_eq!(
            parse(r#"{"templateID":"base","autoPause":true,"autoResume":{"enabled":true}}"#)
                .unwrap(),
            Some(Lifecycle {
                on_timeout: OnTimeout::Pause,
                auto_resume: true,
                keep_memory: true,
            })
        );
        assert_eq!(
            parse(r#"{"templateID":"base","autoPause":true,"autoPauseMemory":false}"#).unwrap(),
            Some(Lifecycle {
                on_timeout: OnTimeout::Pause,
                auto_resume: false,
                keep_memory: false,
            })
        );
        assert_eq!(
            parse(r#"{"templateID":"base","autoPause":true,"autoPauseMemory":true}"#)
                .unwrap()
                .map(|l| l.keep_memory),
            Some(true)
        );
        let refused = r#"{"templateID":"base","autoResume":{"enabled":true}}"#;
        assert_eq!(parse(refused).unwrap_err().status.as_u16(), 400);
    }

    #[test]
    fn pause_and_connect_bodies_as_the_sdk_sends_them() {
        let p: PauseBody = serde_json::from_str("{}").unwrap();
        assert_eq!(p.memory, None);
        let p: PauseBody =
            serde_json::from_str(r#"{"memory":false,"requireHealthyGuest":true}"#).unwrap();
        assert_eq!(p.memory, Some(false));
        let c: ConnectBody = serde_json::from_str(r#"{"timeout":10,"memory":false}"#).unwrap();
        assert_eq!((c.timeout, c.memory), (Some(10), Some(false)));
        let c: ConnectBody = serde_json::from_str(r#"{"timeout":10}"#).unwrap();
        assert_eq!(c.memory, None, "on_resume=restore travels as no field");
    }

    #[test]
    fn state_routes_are_served() {
        for mine in ["/snapshots", "/sandboxes/x/snapshots", "/sandboxes/x/fork"] {
            assert!(is_control_path(mine), "{mine}");
        }
    }

    #[test]
    fn network_options() {
        assert_eq!(
            network_of(None, None).unwrap().mode,
            NetworkMode::Open,
            "E2B default: internet on"
        );
        assert_eq!(
            network_of(Some(false), None).unwrap().mode,
            NetworkMode::None
        );
        assert_eq!(
            network_of(Some(true), None).unwrap().mode,
            NetworkMode::Open
        );
        let deny_all = NetworkRules {
            allow_out: None,
            deny_out: Some(vec![ALL_TRAFFIC.into()]),
            ..Default::default()
        };
        assert_eq!(
            network_of(Some(true), Some(deny_all)).unwrap().mode,
            NetworkMode::None
        );
        let allow = NetworkRules {
            allow_out: Some(vec!["pypi.org".into()]),
            deny_out: Some(vec![ALL_TRAFFIC.into()]),
            ..Default::default()
        };
        let n = network_of(None, Some(allow)).unwrap();
        assert_eq!(
            (n.mode, n.allow),
            (NetworkMode::Allowlist, vec!["pypi.org".to_string()])
        );
        let deny_some = NetworkRules {
            allow_out: None,
            deny_out: Some(vec!["10.0.0.0/8".into()]),
            ..Default::default()
        };
        let n = network_of(None, Some(deny_some)).unwrap();
        assert_eq!(
            (n.mode, n.deny),
            (NetworkMode::Open, vec!["10.0.0.0/8".to_string()]),
            "denyOut without allowOut: deny rules of open mode"
        );
        let update: NetworkUpdate = serde_json::from_value(json!({
            "allowOut": ["pkg.test"], "denyOut": ["0.0.0.0/0"], "allow_internet_access": true
        }))
        .unwrap();
        assert_eq!(
            update.lists.allow_out.as_deref(),
            Some(&["pkg.test".to_string()][..])
        );
        assert_eq!(update.allow_internet_access, Some(true));
    }
}
