//! What every envd request shares: which sandbox (`E2b-Sandbox-Id`), which tenant owns it,
//! the envd access token, the acting user and how its paths resolve; the per-sandbox state
//! E2B needs beyond the session manager; the envd router.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;
use koder_auth::Identity;
use koder_http::credentials;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::HttpError;
use crate::E2b;

pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";
/// Users of an E2B sandbox: `user` (uid 1000, the default) and `root`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum User {
    Root,
    User,
}

impl User {
    pub fn parse(name: &str) -> Result<Self, HttpError> {
        match name {
            "user" => Ok(User::User),
            "root" => Ok(User::Root),
            other => Err(HttpError::unauthorized(format!(
                "invalid user {other:?}: this sandbox has the users \"user\" and \"root\""
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            User::Root => "root",
            User::User => "user",
        }
    }

    pub fn home(self) -> &'static str {
        match self {
            User::Root => "/root",
            User::User => "/home/user",
        }
    }

    /// Absolute, lexically normalised path of `path` as this user means it: relative paths
    /// and `~` are below the user's home.
    pub fn resolve(self, path: &str) -> String {
        let joined = if path.is_empty() || path == "~" {
            self.home().to_string()
        } else if let Some(rest) = path.strip_prefix("~/") {
            format!("{}/{rest}", self.home())
        } else if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{}/{path}", self.home())
        };
        normalize(&joined)
    }
}

/// `/a/./b/../c//d` → `/a/c/d`; `..` at the root stays at the root (as the agent resolves).
pub fn normalize(abs: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in abs.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Parent directory and last component of a normalised path; `None` for the root.
pub fn split_parent(abs: &str) -> Option<(&str, &str)> {
    let (parent, name) = abs.rsplit_once('/')?;
    if name.is_empty() {
        return None;
    }
    Some((if parent.is_empty() { "/" } else { parent }, name))
}

/// E2B state of one sandbox that the session manager does not keep.
#[derive(Default)]
pub struct SandboxCtx {
    pub procs: Mutex<HashMap<u32, crate::process::Proc>>,
    pub watchers: Mutex<HashMap<String, crate::filesystem::Watcher>>,
    /// The sandbox's default JavaScript context (the default Python one is the manager's).
    pub js_context: tokio::sync::Mutex<Option<String>>,
}

impl E2b {
    /// The envd access token of a sandbox, derived rather than stored: any daemon component
    /// can check it and a restart (which ends every sandbox) invalidates all of them.
    pub fn envd_token(&self, id: &str) -> String {
        hex::encode(hmac_sha256(&self.inner.token_secret, id.as_bytes()))
    }

    pub(crate) fn ctx(&self, id: &str) -> Arc<SandboxCtx> {
        self.inner
            .sandboxes
            .lock()
            .entry(id.to_string())
            .or_default()
            .clone()
    }

    /// Drops what E2B kept for a sandbox that ended; its watchers stop with it.
    pub(crate) fn forget(&self, id: &str) {
        let gone = self.inner.sandboxes.lock().remove(id);
        if let Some(ctx) = gone {
            for (_, w) in ctx.watchers.lock().drain() {
                w.stop();
            }
        }
        self.inner.cpu_samples.lock().remove(id);
    }
}

/// HMAC-SHA256 (RFC 2104) with a key of at most one block.
fn hmac_sha256(key: &[u8; 32], msg: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key);
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
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
/// interpreter SDK sends it) or an API key of the owning tenant (`X-API-KEY`). Without either
/// 401, a wrong token 401; a sandbox that is unknown, ended or another tenant's answers as
/// gone, so a key cannot probe other tenants' ids.
pub(crate) async fn authenticate(
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
    let tenant =
        match (token, headers.get(credentials::API_KEY)) {
            (Some(t), _) => {
                if !bool::from(t.as_bytes().ct_eq(e2b.envd_token(&id).as_bytes())) {
                    return Err(HttpError::unauthorized(
                        "invalid access token for this sandbox",
                    ));
                }
                None
            }
            (None, Some(key)) => Some(crate::control::verify_api_key(e2b, key)?.tenant_id),
            (None, None) => return Err(HttpError::unauthorized(
                "missing X-Access-Token (the envdAccessToken of create or connect) or X-API-KEY",
            )),
        };
    let owner = e2b
        .manager()
        .owner_of_active(&id)
        .await
        .map_err(|e| HttpError::new(503, e.to_string()))?
        .filter(|o| tenant.as_ref().is_none_or(|t| *t == o.tenant_id));
    let Some(who) = owner else {
        if tenant.is_none() {
            // Only a holder of the sandbox's own token may end E2B's state for it.
            e2b.forget(&id);
        }
        return Err(HttpError::sandbox_gone(&id));
    };
    Ok(Authenticated { who, id })
}

/// The sandbox an envd or interpreter request is for, as authenticated, with the acting user.
pub struct Target {
    pub who: Identity,
    pub id: String,
    pub user: User,
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
        Ok(Target {
            who: auth.who,
            user: user_of(parts)?,
            ctx: e2b.ctx(&auth.id),
            id: auth.id,
            e2b: e2b.clone(),
        })
    }
}

/// `Authorization: Basic base64("<user>:")` on RPCs, `?username=` on `/files`; `user` when
/// neither is given (the default user of envd ≥ 0.4).
fn user_of(parts: &Parts) -> Result<User, HttpError> {
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
        return User::parse(name);
    }
    let query: Query<HashMap<String, String>> =
        Query::try_from_uri(&parts.uri).map_err(|e| HttpError::bad_request(e.body_text()))?;
    match query.get("username").map(String::as_str) {
        None | Some("") => Ok(User::User),
        Some(name) => User::parse(name),
    }
}

pub fn router() -> Router<E2b> {
    Router::new()
        .route("/health", get(health))
        .route(
            "/files",
            get(crate::files::download).post(crate::files::upload),
        )
        .route("/process.Process/{method}", post(crate::process::rpc))
        .route(
            "/filesystem.Filesystem/{method}",
            post(crate::filesystem::rpc),
        )
        .fallback(|| async { HttpError::not_found("no such envd endpoint") })
}

/// 204 while the sandbox runs; a gone sandbox is the extractor's 502.
async fn health(_t: Target) -> impl IntoResponse {
    StatusCode::NO_CONTENT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_against_the_users_home() {
        assert_eq!(User::User.resolve("a/b.txt"), "/home/user/a/b.txt");
        assert_eq!(User::Root.resolve("a"), "/root/a");
        assert_eq!(User::User.resolve(""), "/home/user");
        assert_eq!(User::User.resolve("~/x"), "/home/user/x");
        assert_eq!(User::User.resolve("/tmp/../etc//./x"), "/etc/x");
        assert_eq!(User::User.resolve("../../../.."), "/");
        assert_eq!(split_parent("/a/b"), Some(("/a", "b")));
        assert_eq!(split_parent("/a"), Some(("/", "a")));
        assert_eq!(split_parent("/"), None);
    }

    #[test]
    fn hmac_matches_rfc_4231_shape() {
        // RFC 4231 test case 2 uses a short key; with the key zero-padded to 32 bytes the
        // HMAC is unchanged (keys are zero-padded to the block size either way).
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        assert_eq!(
            hex::encode(hmac_sha256(&key, b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn users() {
        assert_eq!(User::parse("user").unwrap(), User::User);
        assert_eq!(User::parse("root").unwrap().home(), "/root");
        assert_eq!(User::parse("admin").unwrap_err().status.as_u16(), 401);
    }
}
