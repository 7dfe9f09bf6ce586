//! The session's dev server from outside: `GET .../upstream`, `POST .../preview {port}` and the
//! reverse proxy `ANY .../preview/{*path}` (HTTP and WebSocket upgrades).
//!
//! Each proxied connection is a TCP connection the agent opens inside the sandbox's network
//! namespace, carried over the agent channel; a local in-memory pipe adapts it to hyper's
//! client. The caller's credentials never reach the sandbox.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use koder_sessions::{Upstream, UpstreamConn};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::extract::{Caller, Json, Path};
use crate::gate::HeldStream;
use crate::AppState;

type ApiResult<T> = Result<T, ApiError>;

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UpstreamInfo {
    /// The dev server's address inside the sandbox.
    pub url: String,
    pub port: u16,
    /// Whether the port was pinned with `POST .../preview`.
    pub pinned: bool,
    /// Path of the daemon's reverse proxy to it.
    pub preview_path: String,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PinPreview {
    #[schema(minimum = 1, maximum = 65535)]
    pub port: u16,
}

fn info(id: &str, u: Upstream) -> UpstreamInfo {
    UpstreamInfo {
        url: format!("http://127.0.0.1:{}", u.port),
        port: u.port,
        pinned: u.pinned,
        preview_path: format!("/v1/sandbox/sessions/{id}/preview/"),
    }
}

#[utoipa::path(get, path = "/v1/sandbox/sessions/{id}/upstream", tag = "live",
    params(("id" = String, Path)),
    responses((status = 200, body = UpstreamInfo), (status = 404, body = koder_api_types::ErrorBody),
              (status = 503, body = koder_api_types::ErrorBody, description = "SANDBOX-PREVIEW-NOT-LISTENING")),
    security(("bearer" = [])))]
pub async fn upstream(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<UpstreamInfo>> {
    let u = s.manager.upstream(&who, &id).await?;
    Ok(axum::Json(info(&id, u)))
}

#[utoipa::path(post, path = "/v1/sandbox/sessions/{id}/preview", tag = "live",
    params(("id" = String, Path)), request_body = PinPreview,
    responses((status = 200, body = UpstreamInfo), (status = 400, body = koder_api_types::ErrorBody),
              (status = 503, body = koder_api_types::ErrorBody, description = "pinned, but nothing listens there yet")),
    security(("bearer" = [])))]
pub async fn pin(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(id): Path<String>,
    Json(req): Json<PinPreview>,
) -> ApiResult<axum::Json<UpstreamInfo>> {
    let u = s.manager.pin_preview(&who, &id, req.port).await?;
    Ok(axum::Json(info(&id, u)))
}

/// Headers that describe one hop, not the message (RFC 9110 §7.6.1).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes what must not cross the proxy: hop-by-hop headers, those the `Connection` header
/// names, and (towards the sandbox) every credential the daemon understands. An upgrade keeps
/// `Connection: upgrade` and `Upgrade`, which are what ask for the protocol switch.
fn strip(headers: &mut axum::http::HeaderMap, credentials: bool, upgrade: bool) {
    strip_hop_by_hop(headers, upgrade);
    if credentials {
        for name in crate::credentials::ALL {
            headers.remove(*name);
        }
    }
}

/// Removes the headers that describe one hop of a proxied message (RFC 9110 §7.6.1) and those
/// its `Connection` header names; an upgrade keeps `Connection: upgrade` and `Upgrade`.
pub fn strip_hop_by_hop(headers: &mut axum::http::HeaderMap, upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        if !(upgrade && name == header::UPGRADE) {
            headers.remove(name);
        }
    }
    for name in HOP_BY_HOP {
        if !(upgrade && (*name == "connection" || *name == "upgrade")) {
            headers.remove(*name);
        }
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

pub async fn proxy(
    State(s): State<AppState>,
    Caller(who): Caller,
    Path(params): Path<Vec<(String, String)>>,
    mut req: Request,
) -> ApiResult<Response> {
    let mut id = None;
    let mut rest = String::new();
    for (k, v) in params {
        match k.as_str() {
            "id" => id = Some(v),
            "path" => rest = v,
            _ => {}
        }
    }
    let id = id.ok_or_else(|| ApiError::invalid("missing session id"))?;
    let (upstream, conn) = s.manager.connect_upstream(&who, &id).await?;
    let target = match req.uri().query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    *req.uri_mut() = target
        .parse::<Uri>()
        .map_err(|_| ApiError::invalid("preview path is not a valid URI path"))?;
    let host = HeaderValue::from_str(&format!("127.0.0.1:{}", upstream.port)).ok();
    let prefix = format!("/v1/sandbox/sessions/{id}/preview");
    forward(conn, req, host, Some(&prefix)).await
}

/// Forwards `req` (its URI already the one to ask for) over `conn`, a connection to a server
/// inside a sandbox, WebSocket upgrades included; the answer is the server's. `host` replaces
/// the `Host` header (`None` keeps the client's); `prefix` is the path the client reached the
/// server under, sent as `X-Forwarded-Prefix`. Credentials the daemon understands never cross.
pub async fn forward(
    conn: UpstreamConn,
    mut req: Request,
    host: Option<HeaderValue>,
    prefix: Option<&str>,
) -> ApiResult<Response> {
    let upgrade = req.headers().contains_key(header::UPGRADE);
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let held = HeldStream::take_from(&mut req);

    let (mut parts, body) = req.into_parts();
    strip(&mut parts.headers, true, upgrade);
    if let Some(host) = host {
        parts.headers.insert(header::HOST, host);
    }
    if let Some(prefix) = prefix.and_then(|p| HeaderValue::from_str(p).ok()) {
        parts
            .headers
            .insert(HeaderName::from_static("x-forwarded-prefix"), prefix);
    }
    let forwarded = Request::from_parts(parts, body);

    // Header names in their conventional case (`Host`, `Content-Type`), as HTTP/1 proxies send
    // them: servers that echo or log headers see what a browser would have sent.
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake::<_, Body>(TokioIo::new(conn))
        .await
        .map_err(|e| {
            ApiError::new(
                502,
                koder_api_types::codes::PREVIEW_NOT_LISTENING,
                format!("upstream: {e}"),
            )
        })?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut resp = sender.send_request(forwarded).await.map_err(|e| {
        ApiError::new(
            502,
            koder_api_types::codes::PREVIEW_NOT_LISTENING,
            format!("upstream: {e}"),
        )
    })?;

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let upstream_upgrade = hyper::upgrade::on(&mut resp);
            tokio::spawn(held.during(async move {
                if let (Ok(client), Ok(up)) = (client_upgrade.await, upstream_upgrade.await) {
                    let _ = tokio::io::copy_bidirectional(
                        &mut TokioIo::new(client),
                        &mut TokioIo::new(up),
                    )
                    .await;
                }
            }));
        }
    }
    let (mut parts, body) = resp.into_parts();
    let switched = parts.status == StatusCode::SWITCHING_PROTOCOLS;
    strip(&mut parts.headers, false, switched);
    Ok(Response::from_parts(parts, Body::new(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> axum::http::HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn credentials_and_hop_by_hop_headers_never_reach_the_sandbox() {
        let mut h = headers(&[
            ("authorization", "Bearer k"),
            ("x-api-key", "k"),
            ("x-access-token", "t"),
            ("e2b-traffic-access-token", "t"),
            ("cookie", "session=1"),
            ("proxy-authorization", "Basic x"),
            ("connection", "keep-alive, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("te", "trailers"),
            ("accept", "text/html"),
        ]);
        strip(&mut h, true, false);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["accept"]);
        for name in crate::credentials::ALL {
            assert!(!h.contains_key(*name), "{name}");
        }
    }

    #[test]
    fn an_upgrade_keeps_what_asks_for_it() {
        let mut h = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("cookie", "a=b"),
        ]);
        strip(&mut h, true, true);
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["upgrade"], "websocket");
        assert!(!h.contains_key("cookie"));
    }
}
