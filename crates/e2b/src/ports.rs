//! A sandbox's own servers by host name (`https://<port>-<id>.<domain>`, what E2B's
//! `Sandbox.get_host(port)` names): the request is forwarded, WebSocket upgrades included, to
//! that port inside the sandbox over a connection the agent makes in the sandbox's network
//! namespace. As in E2B the ports are public unless the sandbox was created with
//! `network.allowPublicTraffic: false`; then (and for every sandbox this adapter holds no
//! record of) the request must carry the sandbox's `e2b-traffic-access-token`. A paused
//! sandbox whose lifecycle resumes on requests is resumed first. `maskRequestHost` replaces the
//! `Host` the server sees.

use std::sync::atomic::Ordering;

use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use koder_http::credentials;
use subtle::ConstantTimeEq;

use crate::error::HttpError;
use crate::host::HostRoute;
use crate::state::E2b;

pub(crate) async fn serve(e2b: &E2b, route: HostRoute, req: Request) -> Response {
    match forward(e2b, route, req).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

async fn forward(e2b: &E2b, route: HostRoute, mut req: Request) -> Result<Response, HttpError> {
    let id = route.sandbox.as_str();
    let who = e2b
        .manager()
        .owner_of_active(id)
        .await
        .map_err(|e| HttpError::new(503, e.to_string()))?
        .ok_or_else(|| HttpError::sandbox_gone(id))?;
    let public = e2b.ctx(id).public_traffic.load(Ordering::Relaxed);
    if !public {
        let token = req.headers().get(credentials::TRAFFIC_ACCESS_TOKEN);
        let valid =
            token.is_some_and(|t| bool::from(t.as_bytes().ct_eq(e2b.envd_token(id).as_bytes())));
        if !valid {
            return Err(HttpError::new(
                403,
                "this sandbox's ports need its traffic access token (header e2b-traffic-access-token)",
            ));
        }
    }
    let limits = &e2b.app().limits;
    limits.check_request(&who.tenant_id)?;
    // A WebSocket (or any upgrade) is a stream of the tenant's while it lasts.
    if req.headers().contains_key(header::UPGRADE) {
        koder_http::hold_stream_place(&mut req, limits.open_stream(&who.tenant_id)?);
    }
    let conn = match e2b.manager().connect_port(&who, id, route.port).await {
        Ok(conn) => conn,
        // E2B's words, which its SDK and users recognise.
        Err(koder_sessions::Error::PreviewNotListening(_)) => {
            return Err(HttpError::port_closed(id, route.port))
        }
        Err(e) => return Err(e.into()),
    };
    // The client's Host is the name it asked for, which a server behind a proxy expects,
    // unless the sandbox asked for another.
    let mask = e2b.ctx(id).mask_request_host.lock().clone();
    let host = mask
        .and_then(|m| HeaderValue::from_str(&m.replace("${PORT}", &route.port.to_string())).ok());
    Ok(koder_http::forward_to_sandbox(conn, req, host, None).await?)
}
