//! Every non-2xx answer is `{"error": {"code", "message", "details"?}}` (API.md "Errors").

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use koder_api_types::{codes, ErrorBody, ErrorDetail};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(400, codes::INVALID_ARGUMENT, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(401, codes::AUTH, message)
    }
}

impl From<koder_sessions::Error> for ApiError {
    fn from(e: koder_sessions::Error) -> Self {
        if e.http_status() == 500 {
            tracing::error!(error = %e, "request failed");
        }
        Self::new(e.http_status(), e.code(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.into(),
                message: self.message,
                details: None,
            },
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}
