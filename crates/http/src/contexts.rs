//! Code-interpreter routes under `/v1/sandbox/sessions/{id}/contexts` (being written).

use axum::Router;

use crate::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
}
