//! The sandbox side of E2B, for requests routed by `E2b-Sandbox-Id`: envd (port 49983: the
//! Connect RPC `process` and `filesystem` services, `/files`, `/health`) and the code
//! interpreter (port 49999). [`auth`] establishes who acts on which sandbox before either
//! router sees a request; the services below only consume its [`auth::Target`].

pub mod auth;
pub mod files;
pub mod filesystem;
pub mod interpreter;
pub mod process;
pub mod sandbox;
pub(crate) mod signature;
pub mod user;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;

use crate::error::HttpError;
use crate::state::E2b;
use auth::Target;

pub fn router() -> Router<E2b> {
    Router::new()
        .route("/health", get(health))
        .route("/files", get(files::download).post(files::upload))
        .route("/process.Process/{method}", post(process::rpc))
        .route("/filesystem.Filesystem/{method}", post(filesystem::rpc))
        .fallback(|| async { HttpError::not_found("no such envd endpoint") })
}

/// 204 while the sandbox runs; a gone sandbox is the extractor's 502.
async fn health(_t: Target) -> impl IntoResponse {
    StatusCode::NO_CONTENT
}
