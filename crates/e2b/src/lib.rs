//! E2B compatibility (`docs/E2B-COMPAT.md`): existing E2B code runs against koder-sandbox
//! by pointing `E2B_API_URL` and `E2B_SANDBOX_URL` at the daemon and using a koder-sandbox key
//! as `E2B_API_KEY`.
//!
//! Three surfaces share the daemon's HTTP port, all thin adapters over the session manager:
//! - the control plane (`/sandboxes`, `/v2/sandboxes`, authenticated by `X-API-KEY`), where an
//!   E2B sandbox is a koder-sandbox session of the same tenant ([`control`]);
//! - envd, the in-sandbox agent E2B's SDK talks to, for requests carrying `E2b-Sandbox-Id`
//!   and `E2b-Sandbox-Port: 49983`: Connect RPC process and filesystem services and the
//!   `/files` and `/health` endpoints ([`envd`]);
//! - the code interpreter on port 49999 (`/execute`, `/contexts`), also under [`envd`];
//! - with a sandbox domain (`[e2b] domain`), the names `<port>-<id>.<domain>` ([`host`]):
//!   envd's and the interpreter's ports as above, any other port forwarded to the sandbox's
//!   own server there ([`ports`]).
//!
//! Modules form layers that only import downwards: `lib` (dispatch) → the routers
//! (`control`, `envd` and their services, `ports`) → `envd::auth` → `state` → leaves
//! (`connect`, `error`, `host`, `proto`, `envd::user`, `envd::sandbox` and the tables it holds).

pub mod connect;
pub mod control;
mod envd;
mod error;
mod host;
mod ports;
mod proto;
mod state;

use std::future::Future;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower::ServiceExt as _;
use tracing::Instrument as _;

pub use control::templates::{TemplateFiles, TemplateLimits};
pub use control::ENVD_VERSION;
use envd::auth::{SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER};
use error::close_connection;
pub use error::HttpError;
pub use state::E2b;

/// The sandbox a request names by its host, `<port>-<id>.<domain>` (its `:authority` or
/// `Host`), under the sandbox domain `domain` (`[e2b] domain`): for layers in front of the
/// E2B surfaces that must know a request's sandbox before they serve it (a cluster's).
pub fn sandbox_of_host(uri: &Uri, headers: &HeaderMap, domain: &str) -> Option<String> {
    host::route(uri, headers, domain).map(|r| r.sandbox)
}

/// The port of envd inside an E2B sandbox, named by `E2b-Sandbox-Port`.
pub const ENVD_PORT: &str = "49983";
/// The port of the code interpreter inside an E2B sandbox.
pub const INTERPRETER_PORT: &str = "49999";

/// Puts the E2B surfaces in front of the native router: requests carrying `E2b-Sandbox-Id` go
/// to envd or the interpreter, E2B's API paths to the control plane, the rest to the native
/// API. (None of E2B's paths is a native one.)
pub fn mount(native: Router, e2b: E2b) -> Router {
    let named = || axum::middleware::from_fn(name_span);
    let dispatch = Dispatch {
        envd: envd::router().route_layer(named()).with_state(e2b.clone()),
        interpreter: envd::interpreter::router()
            .route_layer(named())
            .with_state(e2b.clone()),
        control: control::router()
            .route_layer(named())
            .with_state(e2b.clone()),
        e2b,
    };
    native.layer(axum::middleware::from_fn_with_state(dispatch, by_surface))
}

#[derive(Clone)]
struct Dispatch {
    envd: Router,
    interpreter: Router,
    control: Router,
    e2b: E2b,
}

async fn by_surface(State(d): State<Dispatch>, mut req: Request, next: Next) -> Response {
    let named = d
        .e2b
        .domain()
        .and_then(|domain| host::route(req.uri(), req.headers(), domain));
    if let Some(route) = named {
        let port = route.port.to_string();
        if port != ENVD_PORT && port != INTERPRETER_PORT {
            return ports::serve(&d.e2b, route, req).await;
        }
        // envd and the interpreter by name: the name says what the headers would.
        match (
            HeaderValue::from_str(&route.sandbox),
            HeaderValue::from_str(&port),
        ) {
            (Ok(id), Ok(port)) => {
                req.headers_mut().insert(SANDBOX_ID_HEADER, id);
                req.headers_mut().insert(SANDBOX_PORT_HEADER, port);
            }
            _ => return HttpError::bad_request("unusable sandbox host name").into_response(),
        }
    }
    if !req.headers().contains_key(SANDBOX_ID_HEADER) {
        if control::is_control_path(req.uri().path()) {
            let span =
                koder_telemetry::surface_span(req.method().as_str(), "e2b.control", req.headers());
            return traced(span, serve(d.control, req)).await;
        }
        // A signed file URL handed to a plain HTTP client names its sandbox by its signature.
        match envd::auth::signer_of(req.method(), req.uri(), &d.e2b) {
            Ok(Some(id)) => match HeaderValue::from_str(&id) {
                Ok(v) => {
                    req.headers_mut().insert(SANDBOX_ID_HEADER, v);
                }
                Err(_) => return next.run(req).await,
            },
            Ok(None) => return next.run(req).await,
            Err(e) => return e.into_response(),
        }
    }
    let span = koder_telemetry::surface_span(req.method().as_str(), "e2b.sandbox", req.headers());
    traced(span, in_sandbox(d, req)).await
}

/// An envd or interpreter request: authenticated and admitted here, whatever its route, then
/// served by the port's router.
async fn in_sandbox(d: Dispatch, mut req: Request) -> Response {
    let port = req
        .headers()
        .get(SANDBOX_PORT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(ENVD_PORT)
        .to_string();
    let router = match port.as_str() {
        ENVD_PORT => d.envd,
        INTERPRETER_PORT => d.interpreter,
        // Other ports are served by host name (`crate::ports`), which needs `[e2b] domain`;
        // the SDK maps this message to "sandbox running, port not open".
        other => {
            return HttpError::new(
                502,
                format!("The sandbox is running but port is not open: koder-sandbox serves only ports {ENVD_PORT} and {INTERPRETER_PORT} through E2B-Sandbox-Port, not {other}; other ports by host name <port>-<id>.<domain> when [e2b] domain is set"),
            )
            .into_response()
        }
    };
    // Every in-sandbox surface, whatever the route (even an unknown one), is authenticated
    // and admitted here, before a router sees the request.
    let interpreter = port == INTERPRETER_PORT;
    let admitted =
        match envd::auth::authenticate(req.method(), req.uri(), req.headers(), &d.e2b).await {
            Ok(auth) => auth
                .admit(&d.e2b, req.headers(), req.uri().path(), interpreter)
                .map(|places| (auth, places)),
            Err(e) => Err(e),
        };
    let places = match admitted {
        Ok((auth, places)) => {
            req.extensions_mut().insert(auth);
            places
        }
        Err(e) => {
            let mut resp = e.into_response();
            close_connection(&mut resp);
            return resp;
        }
    };
    let resp = serve(router, req).await;
    match places {
        Some(places) => koder_http::hold_during_body(resp, places),
        None => resp,
    }
}

/// Runs an E2B request in its request span (named by its route once routed, see
/// [`name_span`]), as the native API's are: its execs and creates are its children.
async fn traced(span: tracing::Span, answer: impl Future<Output = Response>) -> Response {
    let resp = answer.instrument(span.clone()).await;
    koder_telemetry::record_status(&span, resp.status().as_u16());
    resp
}

/// Names the request span by the route template its router matched.
async fn name_span(req: Request, next: Next) -> Response {
    if let Some(route) = req.extensions().get::<MatchedPath>() {
        koder_telemetry::record_route(
            &tracing::Span::current(),
            req.method().as_str(),
            route.as_str(),
        );
    }
    next.run(req).await
}

async fn serve(router: Router, req: Request) -> Response {
    let mut resp = match router.oneshot(req).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    };
    if resp.status().is_client_error() || resp.status().is_server_error() {
        close_connection(&mut resp);
    }
    resp
}
