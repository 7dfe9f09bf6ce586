//! Who acts on which sandbox: every envd and interpreter request names its sandbox
//! (`E2b-Sandbox-Id`), proves the right to it (the sandbox's access token or an API key of the
//! owning tenant) and names the acting user; [`Target`] carries the result to the handlers.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, Method, Uri};
use base64::Engine as _;
use koder_api_types::{Session, SessionState};
use koder_auth::limits::Slot;
use koder_auth::{Identity, Scope};
use koder_http::credentials;
use subtle::ConstantTimeEq;

use super::sandbox::{Defaults, SandboxCtx};
use super::signature::SignedFileUrl;
use super::user::User;
use crate::control::keys;
use crate::control::templates::steps::RECIPE_KIND;
use crate::error::HttpError;
use crate::state::E2b;

pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";

/// The sandbox whose access token signed this `/files` URL, for requests that name none; an
/// unsigned request is `Ok(None)`, a signature no sandbox here made is 401.
pub(crate) fn signer_of(
    method: &Method,
    uri: &Uri,
    e2b: &E2b,
) -> Result<Option<String>, HttpError> {
    let Some(signed) = SignedFileUrl::of(method, uri).transpose()? else {
        return Ok(None);
    };
    e2b.manager()
        .live_ids()
        .into_iter()
        .find(|id| signed.signed_with(&e2b.envd_token(id)))
        .map(Some)
        .ok_or_else(|| HttpError::unauthorized("invalid signature: no sandbox here signed it"))
}
/// Who may act on the sandbox an envd or interpreter request names. Established once per
/// request by [`authenticate`], in front of both routers (`crate::by_surface`), so no route
/// can be served without it.
#[derive(Clone)]
pub(crate) struct Authenticated {
    who: Identity,
    id: String,
}

/// The sandbox's access token (`X-Access-Token`, or `E2B-Traffic-Access-Token` as the
/// interpreter SDK sends it), an API key of the owning tenant (`X-API-KEY`), or on `/files`
/// a URL signed with the sandbox's token ([`SignedFileUrl`]). Without either
/// 401, a wrong token 401; a sandbox that is unknown, ended or another tenant's answers as
/// gone, so a key cannot probe other tenants' ids.
pub(crate) async fn authenticate(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    e2b: &E2b,
) -> Result<Authenticated, HttpError> {
    let id = headers
        .get(SANDBOX_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if id.is_empty() || id.len() > 128 {
        return Err(HttpError::bad_request("E2b-Sandbox-Id must name a sandbox"));
    }
    let token = [credentials::ACCESS_TOKEN, credentials::TRAFFIC_ACCESS_TOKEN]
        .iter()
        .find_map(|h| headers.get(*h));
    let signed = SignedFileUrl::of(method, uri).transpose()?;
    let tenant =
        match (token, headers.get(credentials::API_KEY), signed) {
            (Some(t), _, _) => {
                if !bool::from(t.as_bytes().ct_eq(e2b.envd_token(&id).as_bytes())) {
                    return Err(HttpError::unauthorized(
                        "invalid access token for this sandbox",
                    ));
                }
                None
            }
            (None, Some(_), _) => {
                // envd runs code and reaches every file: the whole surface is `sandbox:exec`.
                let principal = keys::authenticate(e2b, headers).await?;
                principal.require(Scope::Exec)?;
                Some(principal.identity.tenant_id)
            }
            (None, None, Some(signed)) => {
                if !signed.signed_with(&e2b.envd_token(&id)) {
                    return Err(HttpError::unauthorized(
                        "invalid signature for this sandbox",
                    ));
                }
                signed.check_unexpired(chrono::Utc::now().timestamp())?;
                None
            }
            (None, None, None) => return Err(HttpError::unauthorized(
                "missing X-Access-Token (the envdAccessToken of create or connect) or X-API-KEY",
            )),
        };
    let belongs = |o: &Identity| tenant.as_ref().is_none_or(|t| *t == o.tenant_id);
    // A running sandbox needs no waking: memory answers without the store.
    if let Some(who) = e2b.manager().owner_of_running(&id).filter(belongs) {
        return Ok(Authenticated { who, id });
    }
    let owner = e2b
        .manager()
        .owner_of_active(&id)
        .await
        .map_err(|e| HttpError::new(503, e.to_string()))?
        .filter(belongs);
    let Some(who) = owner else {
        if tenant.is_none() {
            // Only a holder of the sandbox's own token may end E2B's state for it.
            e2b.forget(&id);
        }
        return Err(HttpError::sandbox_gone(&id));
    };
    awake(e2b, &who, &id).await?;
    Ok(Authenticated { who, id })
}

/// The places an admitted request holds while its answer runs: an exec (process `Start`, the
/// interpreter's `/execute`) and a stream (Connect server streams, `/execute`'s NDJSON).
pub(crate) struct Places {
    _exec: Option<Slot>,
    _stream: Option<Slot>,
}

impl Authenticated {
    /// Counts the request against the owning tenant's rates, as the native API does.
    pub(crate) fn admit(
        &self,
        e2b: &E2b,
        headers: &HeaderMap,
        path: &str,
        interpreter: bool,
    ) -> Result<Option<Places>, HttpError> {
        let limits = &e2b.app().limits;
        let tenant = self.who.tenant_id.as_str();
        limits.check_request(tenant)?;
        let execute = interpreter && path == "/execute";
        let starts_exec = execute || (!interpreter && path == "/process.Process/Start");
        let streams = execute
            || headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/connect+"));
        if !starts_exec && !streams {
            return Ok(None);
        }
        Ok(Some(Places {
            _exec: starts_exec.then(|| limits.begin_exec(tenant)).transpose()?,
            _stream: streams.then(|| limits.open_stream(tenant)).transpose()?,
        }))
    }
}

/// A paused E2B sandbox is unreachable: its envd answers as gone (502, which the SDK's
/// `is_running()` reads as not running) unless its lifecycle resumes it on a request.
async fn awake(e2b: &E2b, who: &Identity, id: &str) -> Result<(), HttpError> {
    let paused = |s: &Session| s.state == SessionState::Paused;
    if !paused(&e2b.manager().get(who, id).await?) {
        return Ok(());
    }
    if !e2b
        .manager()
        .durable_of(who, id)
        .await?
        .lifecycle
        .auto_resume
    {
        return Err(HttpError::sandbox_gone(id));
    }
    if let Err(e) = e2b.manager().resume(who, id).await {
        // Requests arriving together race to resume it; losing that race is fine.
        if paused(&e2b.manager().get(who, id).await?) {
            return Err(e.into());
        }
    }
    Ok(())
}

/// The sandbox an envd or interpreter request is for, as authenticated, with the acting user.
#[derive(Clone)]
pub struct Target {
    pub who: Identity,
    pub id: String,
    pub user: User,
    /// Where its processes start when they name no directory (`None`: the user's home).
    pub workdir: Option<String>,
    pub ctx: Arc<SandboxCtx>,
    pub e2b: E2b,
}

impl FromRequestParts<E2b> for Target {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, e2b: &E2b) -> Result<Self, HttpError> {
        let Some(auth) = parts.extensions.get::<Authenticated>().cloned() else {
            // Routers are only reachable through `by_surface`, which authenticates first.
            return Err(HttpError::new(500, "request reached envd unauthenticated"));
        };
        let named = user_of(parts)?;
        let ctx = e2b.ctx(&auth.id);
        let defaults = ctx
            .defaults
            .get_or_try_init(|| defaults_of(e2b, &auth.who, &auth.id))
            .await?
            .clone();
        let user = match named {
            Some(name) => User::resolve_in(e2b.manager(), &auth.who, &auth.id, &name).await?,
            None => defaults.user,
        };
        Ok(Target {
            who: auth.who,
            user,
            workdir: defaults.workdir,
            ctx,
            id: auth.id,
            e2b: e2b.clone(),
        })
    }
}

impl Target {
    /// Where a process asking for `cwd` starts: that path as the user means it (relative to
    /// their home), or, when it names none, the sandbox's working directory (the user's home
    /// where the sandbox has none), as envd does.
    pub fn process_cwd(&self, cwd: Option<&str>) -> String {
        match (cwd.filter(|c| !c.is_empty()), &self.workdir) {
            (Some(cwd), _) => self.user.resolve(cwd),
            (None, Some(workdir)) => workdir.clone(),
            (None, None) => self.user.home().to_string(),
        }
    }
}

/// The sandbox's default user and working directory (see [`Defaults`]).
async fn defaults_of(e2b: &E2b, who: &Identity, id: &str) -> Result<Defaults, HttpError> {
    let m = e2b.manager();
    let template = m
        .session_image(who, id)
        .await?
        .filter(|i| i.manifest.recipe["kind"] == RECIPE_KIND);
    Ok(match template {
        Some(image) => Defaults {
            user: User::resolve_in(m, who, id, &image.manifest.user).await?,
            workdir: Some(image.manifest.workdir),
        },
        None => Defaults {
            user: User::unprivileged(),
            workdir: None,
        },
    })
}

/// The user a request names: `Authorization: Basic base64("<user>:")` on RPCs, `?username=`
/// on `/files`; `None` when it names none (envd ≥ 0.4 then acts as the sandbox's default user).
fn user_of(parts: &Parts) -> Result<Option<String>, HttpError> {
    if let Some(auth) = parts.headers.get(header::AUTHORIZATION) {
        let basic = auth
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Basic "))
            .ok_or_else(|| HttpError::unauthorized("Authorization must be Basic <user>:"))?;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(basic.trim())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| HttpError::unauthorized("malformed Basic credentials"))?;
        let name = decoded.split(':').next().unwrap_or("");
        return Ok(Some(name.to_string()));
    }
    let query: Query<HashMap<String, String>> =
        Query::try_from_uri(&parts.uri).map_err(|e| HttpError::bad_request(e.body_text()))?;
    Ok(query.get("username").filter(|n| !n.is_empty()).cloned())
}
