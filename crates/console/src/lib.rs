//! The web console: the front-end built from `console/src` by `scripts/console-build.sh` into
//! `console/dist` (checked in), embedded here so a Rust-only build serves it at `/console`.
//! It is a client of the public API like any other: the files need no credential, every call
//! they make carries the user's key itself. Every answer carries a self-only
//! Content-Security-Policy, so even sandbox output that slipped past the renderer could neither
//! run script nor reach another origin.

use axum::extract::Path;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

/// Where the console is served.
pub const PREFIX: &str = "/console";

/// Scripts, styles, images and connections from the daemon's own origin only; no frames, no
/// plugins, no `<base>` rewrite, forms post nowhere else.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self' data: blob:; font-src 'self'; connect-src 'self'; \
    frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'";

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $type:literal) => {
        Asset {
            name: $name,
            content_type: $type,
            body: include_bytes!(concat!("../../../console/dist/", $name)),
        }
    };
}

const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("console.js", "text/javascript; charset=utf-8"),
    asset!("console.css", "text/css; charset=utf-8"),
];

/// The console's routes, for any state (they use none): merge them into the daemon's router.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(PREFIX, get(|| async { Redirect::permanent("/console/") }))
        .route("/console/", get(|| async { serve("index.html") }))
        .route(
            "/console/{file}",
            get(|Path(file): Path<String>| async move { serve(&file) }),
        )
        .route_layer(axum::middleware::map_response(harden))
}

fn serve(name: &str) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => (
            [
                (header::CONTENT_TYPE, a.content_type),
                // Names carry no digest: a browser revalidates, so an upgraded daemon's console
                // is never mixed with a cached older half.
                (header::CACHE_CONTROL, "no-cache"),
            ],
            a.body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "not found").into_response(),
    }
}

async fn harden(mut res: Response) -> Response {
    let h = res.headers_mut();
    let set = [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (
            HeaderName::from_static("cross-origin-opener-policy"),
            "same-origin",
        ),
        (
            HeaderName::from_static("cross-origin-resource-policy"),
            "same-origin",
        ),
    ];
    for (name, value) in set {
        h.insert(name, HeaderValue::from_static(value));
    }
    res
}

#[cfg(test)]
mod tests;
