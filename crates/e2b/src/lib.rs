//! E2B compatibility (`docs/E2B-COMPAT.md`): existing E2B code runs against koder-sandbox
//! by pointing `E2B_API_URL` and `E2B_SANDBOX_URL` at the daemon and using a koder-sandbox key
//! as `E2B_API_KEY`.
//!
//! Three surfaces share the daemon's HTTP port, all thin adapters over the session manager:
//! - the control plane (`/sandboxes`, `/v2/sandboxes`, authenticated by `X-API-KEY`), where an
//!   E2B sandbox is a koder-sandbox session of the same tenant ([`control`]);
//! - envd, the in-sandbox agent E2B's SDK talks to, for requests carrying `E2b-Sandbox-Id`
//!   and `E2b-Sandbox-Port: 49983`: Connect RPC process and filesystem services ([`process`],
//!   [`filesystem`]) and the `/files` and `/health` endpoints ([`files`]);
//! - the code interpreter on port 49999 (`/execute`, `/contexts`) ([`interpreter`]).

pub mod connect;
pub mod control;
mod envd;
mod error;
mod files;
mod filesystem;
mod interpreter;
mod process;
mod proto;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use koder_http::AppState;
use koder_sessions::{Manager, SessionConfig};
use parking_lot::Mutex;
use tower::ServiceExt as _;

pub use error::HttpError;

/// The port of envd inside an E2B sandbox, named by `E2b-Sandbox-Port`.
pub const ENVD_PORT: &str = "49983";
/// The port of the code interpreter inside an E2B sandbox.
pub const INTERPRETER_PORT: &str = "49999";
/// What envd version the SDK is told: 0.6.4 unlocks every feature the SDK gates on a version
/// (stdin control, octet-stream uploads, recursive watch, entry info in watch events).
pub const ENVD_VERSION: &str = "0.6.4";

/// The E2B adapter's state: the native API's state plus what only E2B needs.
#[derive(Clone)]
pub struct E2b {
    inner: Arc<Inner>,
}

struct Inner {
    app: AppState,
    sessions: SessionConfig,
    /// Keys the derivation of per-sandbox envd access tokens; new at every start, so tokens of
    /// a previous run (whose sandboxes are gone anyway) never verify.
    token_secret: [u8; 32],
    /// Per-sandbox envd state: processes started through E2B, watchers, interpreter contexts.
    sandboxes: Mutex<HashMap<String, Arc<envd::SandboxCtx>>>,
    /// The previous CPU reading per sandbox, so a metrics sample reports current use.
    cpu_samples: Mutex<HashMap<String, control::CpuSample>>,
}

impl E2b {
    /// `sessions` is the configuration the manager runs with (timeouts the E2B defaults map to).
    pub fn new(app: AppState, sessions: SessionConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                app,
                sessions,
                token_secret: rand::random(),
                sandboxes: Mutex::default(),
                cpu_samples: Mutex::default(),
            }),
        }
    }

    pub(crate) fn manager(&self) -> &Arc<Manager> {
        &self.inner.app.manager
    }

    pub(crate) fn app(&self) -> &AppState {
        &self.inner.app
    }

    pub(crate) fn sessions_cfg(&self) -> &SessionConfig {
        &self.inner.sessions
    }
}

/// Puts the E2B surfaces in front of the native router: requests carrying `E2b-Sandbox-Id` go
/// to envd or the interpreter, E2B's API paths to the control plane, the rest to the native
/// API. (None of E2B's paths is a native one.)
pub fn mount(native: Router, e2b: E2b) -> Router {
    let dispatch = Dispatch {
        envd: envd::router().with_state(e2b.clone()),
        interpreter: interpreter::router().with_state(e2b.clone()),
        control: control::router().with_state(e2b.clone()),
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
    if !req.headers().contains_key(envd::SANDBOX_ID_HEADER) {
        if control::is_control_path(req.uri().path()) {
            return serve(d.control, req).await;
        }
        return next.run(req).await;
    }
    let port = req
        .headers()
        .get(envd::SANDBOX_PORT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(ENVD_PORT)
        .to_string();
    let router = match port.as_str() {
        ENVD_PORT => d.envd,
        INTERPRETER_PORT => d.interpreter,
        // Other in-sandbox ports would need a proxy to arbitrary ports, which sessions do not
        // offer (the native preview proxy reaches one upstream). The SDK maps this message to
        // "sandbox running, port not open".
        other => {
            return HttpError::new(
                502,
                format!("The sandbox is running but port is not open: koder-sandbox serves only ports {ENVD_PORT} and {INTERPRETER_PORT} through E2B routing, not {other}"),
            )
            .into_response()
        }
    };
    // Every in-sandbox surface, whatever the route (even an unknown one), is authenticated
    // here, before a router sees the request.
    match envd::authenticate(req.headers(), &d.e2b).await {
        Ok(auth) => {
            req.extensions_mut().insert(auth);
        }
        Err(e) => {
            let mut resp = e.into_response();
            close_connection(&mut resp);
            return resp;
        }
    }
    serve(router, req).await
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

/// An answer given before the request body was read leaves hyper unable to reuse the
/// connection, and a client that reused it anyway would fail its next request: say so.
pub(crate) fn close_connection(resp: &mut Response) {
    resp.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
}
