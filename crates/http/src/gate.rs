//! The one admission layer in front of every tenant route (`/v1/sandbox/...` but the admin
//! endpoints): authenticate the bearer token, check the route's scope, count the request
//! against the tenant's rate, and hold an exec or stream place for as long as the answer runs.
//! Handlers read the result through [`crate::extract::Caller`], so no tenant route can be served
//! without it, including routes added later.

use std::future::Future;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use koder_auth::limits::Slot;
use koder_auth::{AuthError, Principal, Scope};
use parking_lot::Mutex;

use crate::error::ApiError;
use crate::AppState;

/// The admitted caller, for the extractors.
#[derive(Clone)]
pub(crate) struct Admitted(pub Principal);

pub(crate) async fn admit(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    let Some(route) = req.extensions().get::<MatchedPath>().cloned() else {
        return next.run(req).await;
    };
    let Some(needed) = scope_of(req.method(), route.as_str()) else {
        return next.run(req).await;
    };
    // Operators are no tenant: where they may act too, their handlers admit them.
    if is_operator_route(route.as_str()) && holds_admin_key(&s, req.headers()) {
        return next.run(req).await;
    }
    let places = match admission(&s, req.method(), req.headers(), route.as_str(), needed).await {
        Ok(admitted) => admitted,
        Err(e) => return e.into_response(),
    };
    let (principal, exec, mut stream) = places;
    if is_websocket(req.headers()) {
        // The connection outlives this response: the handler moves the place into it.
        req.extensions_mut().insert(StreamPlace::new(stream.take()));
    }
    req.extensions_mut().insert(Admitted(principal));
    let resp = next.run(req).await;
    if is_event_stream(resp.headers()) {
        hold_during_body(resp, (exec, stream))
    } else {
        resp
    }
}

type Places = (Principal, Option<Slot>, Option<Slot>);

async fn admission(
    s: &AppState,
    method: &Method,
    headers: &HeaderMap,
    route: &str,
    needed: Scope,
) -> Result<Places, ApiError> {
    let principal = match websocket_bearer(headers, route) {
        Some(bearer) => check(s, &bearer).await?,
        None => authenticate(s, headers).await?,
    };
    principal.require(needed)?;
    let tenant = principal.identity.tenant_id.as_str();
    s.limits.check_request(tenant)?;
    let exec = is_exec(method, route)
        .then(|| s.limits.begin_exec(tenant))
        .transpose()?;
    let stream = opens_stream(headers, route)
        .then(|| s.limits.open_stream(tenant))
        .transpose()?;
    Ok((principal, exec, stream))
}

/// The caller behind the request's `Authorization` header; every failure is 401.
pub(crate) async fn authenticate(s: &AppState, headers: &HeaderMap) -> Result<Principal, ApiError> {
    let header = headers
        .get(header::AUTHORIZATION)
        .ok_or(AuthError::Missing)?
        .to_str()
        .map_err(|_| ApiError::unauthorized("malformed Authorization header"))?;
    check(s, header).await
}

async fn check(s: &AppState, header: &str) -> Result<Principal, ApiError> {
    s.auth.authenticate_header(header).await.map_err(|e| {
        tracing::debug!(error = %e, "authentication failed");
        ApiError::from(e)
    })
}

/// The scope a tenant route needs; `None` for routes that are not a tenant's (admin, health).
/// Running code (and reaching what code serves) is `exec`; every other change is `write`.
fn scope_of(method: &Method, route: &str) -> Option<Scope> {
    const EXEC: &[&str] = &[
        "/exec",
        "/stdin",
        "/signal",
        "/terminal",
        "/run",
        "/kill-processes",
        "/preview",
        "/preview/",
        "/preview/{*path}",
    ];
    let rest = route.strip_prefix("/v1/sandbox/")?;
    if rest == "admin" || rest.starts_with("admin/") {
        return None;
    }
    Some(if EXEC.iter().any(|e| route.ends_with(e)) {
        Scope::Exec
    } else if matches!(*method, Method::GET | Method::HEAD) {
        Scope::Read
    } else {
        Scope::Write
    })
}

/// Tenant routes an admin key may use as well (images are host-wide: anyone may look, only an
/// operator may delete).
fn is_operator_route(route: &str) -> bool {
    route == "/v1/sandbox/images" || route.starts_with("/v1/sandbox/images/")
}

/// Whether the request's `Authorization` header carries one of the configured admin keys.
pub(crate) fn holds_admin_key(s: &AppState, headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| s.admin_keys.authenticate(h).is_some())
}

/// Execs and code runs count against the tenant's concurrent execs.
fn is_exec(method: &Method, route: &str) -> bool {
    *method == Method::POST && (route.ends_with("/exec") || route.ends_with("/run"))
}

/// WebSockets, Server-Sent Events and the exec output stream count against open streams.
fn opens_stream(headers: &HeaderMap, route: &str) -> bool {
    is_websocket(headers) || crate::live::wants_sse(headers) || route.ends_with("/stream")
}

/// The key a browser's WebSocket offers as a subprotocol (`credentials::WEBSOCKET_BEARER_PREFIX`),
/// as an `Authorization` value; a malformed one is no credential (so the answer is 401).
fn websocket_bearer(headers: &HeaderMap, route: &str) -> Option<String> {
    use base64::Engine as _;
    if headers.contains_key(header::AUTHORIZATION)
        || !is_websocket(headers)
        || route.contains("/preview")
    {
        return None;
    }
    let offered = headers.get(header::SEC_WEBSOCKET_PROTOCOL)?.to_str().ok()?;
    let encoded = offered.split(',').find_map(|p| {
        p.trim()
            .strip_prefix(crate::credentials::WEBSOCKET_BEARER_PREFIX)
    })?;
    let key = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .ok()?;
    Some(format!("Bearer {}", String::from_utf8(key).ok()?))
}

fn is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// `resp` with `guard` kept alive until its body is sent or dropped (the client went away).
pub fn hold_during_body<G: Send + 'static>(resp: Response, guard: G) -> Response {
    let (parts, body) = resp.into_parts();
    let guarded = body.into_data_stream().map(move |chunk| {
        // Naming the guard moves it into the stream, which owns it to its end.
        let _ = &guard;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(guarded))
}

/// Hands `slot` (a stream place taken outside the admission layer, as the E2B host routes do)
/// to `forward_to_sandbox`, which keeps it while an upgraded connection runs.
pub fn hold_stream_place(req: &mut Request, slot: Slot) {
    req.extensions_mut().insert(StreamPlace::new(Some(slot)));
}

/// A WebSocket's stream place, handed from the admission layer to the handler that upgrades.
#[derive(Clone)]
struct StreamPlace(Arc<Mutex<Option<Slot>>>);

impl StreamPlace {
    fn new(slot: Option<Slot>) -> Self {
        Self(Arc::new(Mutex::new(slot)))
    }
}

/// The stream place of an upgrading request, to be kept by the upgraded connection.
pub(crate) struct HeldStream {
    _slot: Option<Slot>,
}

impl HeldStream {
    /// Runs `connection` holding the place.
    pub async fn during<F: Future>(self, connection: F) -> F::Output {
        let _place = self;
        connection.await
    }

    /// Takes the place out of a request the handler consumes whole (the preview proxy).
    pub fn take_from(req: &mut Request) -> Self {
        Self {
            _slot: req
                .extensions_mut()
                .remove::<StreamPlace>()
                .and_then(|p| p.0.lock().take()),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for HeldStream {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self {
            _slot: parts
                .extensions
                .get::<StreamPlace>()
                .and_then(|p| p.0.lock().take()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upgrade(protocols: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, protocols.parse().unwrap());
        h
    }

    #[test]
    fn a_websocket_may_offer_its_key_as_a_subprotocol() {
        // "e2b_k3y?" in base64url without padding.
        let offered = "koder.terminal.v1, koder.bearer.ZTJiX2szeT8";
        let terminal = "/v1/sandbox/sessions/{id}/terminal";
        assert_eq!(
            websocket_bearer(&upgrade(offered), terminal).as_deref(),
            Some("Bearer e2b_k3y?")
        );
        // Never on preview routes (their subprotocols reach the sandbox), never beside an
        // Authorization header, never without an upgrade, never when malformed.
        let preview = "/v1/sandbox/sessions/{id}/preview/{*path}";
        assert_eq!(websocket_bearer(&upgrade(offered), preview), None);
        let mut both = upgrade(offered);
        both.insert(header::AUTHORIZATION, "Bearer other".parse().unwrap());
        assert_eq!(websocket_bearer(&both, terminal), None);
        let mut plain = upgrade(offered);
        plain.remove(header::UPGRADE);
        assert_eq!(websocket_bearer(&plain, terminal), None);
        assert_eq!(
            websocket_bearer(&upgrade("koder.bearer.%%%"), terminal),
            None
        );
        assert_eq!(
            websocket_bearer(&upgrade("koder.terminal.v1"), terminal),
            None
        );
    }

    #[test]
    fn routes_need_their_scopes() {
        let cases = [
            (Method::GET, "/v1/sandbox/sessions", Some(Scope::Read)),
            (Method::POST, "/v1/sandbox/sessions", Some(Scope::Write)),
            (
                Method::GET,
                "/v1/sandbox/sessions/{id}/files",
                Some(Scope::Read),
            ),
            (
                Method::PUT,
                "/v1/sandbox/sessions/{id}/files",
                Some(Scope::Write),
            ),
            (
                Method::POST,
                "/v1/sandbox/sessions/{id}/exec",
                Some(Scope::Exec),
            ),
            (
                Method::GET,
                "/v1/sandbox/sessions/{id}/execs/{exec_id}/stream",
                Some(Scope::Read),
            ),
            (
                Method::POST,
                "/v1/sandbox/sessions/{id}/execs/{exec_id}/stdin",
                Some(Scope::Exec),
            ),
            (
                Method::GET,
                "/v1/sandbox/sessions/{id}/terminal",
                Some(Scope::Exec),
            ),
            (
                Method::GET,
                "/v1/sandbox/sessions/{id}/fs/watch",
                Some(Scope::Read),
            ),
            (
                Method::POST,
                "/v1/sandbox/sessions/{id}/contexts/{cid}/run",
                Some(Scope::Exec),
            ),
            (
                Method::POST,
                "/v1/sandbox/sessions/{id}/contexts",
                Some(Scope::Write),
            ),
            (
                Method::GET,
                "/v1/sandbox/sessions/{id}/preview/{*path}",
                Some(Scope::Exec),
            ),
            (
                Method::DELETE,
                "/v1/sandbox/volumes/{volume}",
                Some(Scope::Write),
            ),
            (Method::GET, "/v1/sandbox/audit/network", Some(Scope::Read)),
            (Method::GET, "/v1/sandbox/admin/tenants", None),
            (Method::GET, "/healthz", None),
        ];
        for (method, route, scope) in cases {
            assert_eq!(scope_of(&method, route), scope, "{method} {route}");
        }
        assert!(is_exec(&Method::POST, "/v1/sandbox/sessions/{id}/exec"));
        assert!(!is_exec(&Method::GET, "/v1/sandbox/sessions/{id}/execs"));
    }

    #[test]
    fn openapi_lists_the_admission_answers() {
        let doc = crate::openapi();
        let exec = doc.paths.paths["/v1/sandbox/sessions/{id}/exec"]
            .post
            .as_ref()
            .unwrap();
        for status in ["401", "403", "429"] {
            assert!(exec.responses.responses.contains_key(status), "{status}");
        }
        let health = doc.paths.paths.get("/healthz");
        assert!(health.is_none_or(|h| h.get.as_ref().unwrap().responses.responses.len() == 1));
    }

    #[tokio::test]
    async fn a_guard_lives_as_long_as_the_body() {
        let held = Arc::new(());
        let resp = hold_during_body(Response::new(Body::from("data")), held.clone());
        assert_eq!(Arc::strong_count(&held), 2);
        let bytes = axum::body::to_bytes(resp.into_body(), 64).await.unwrap();
        assert_eq!(&bytes[..], b"data");
        assert_eq!(Arc::strong_count(&held), 1);
        let resp = hold_during_body(Response::new(Body::from("x")), held.clone());
        drop(resp);
        assert_eq!(Arc::strong_count(&held), 1);
    }
}
