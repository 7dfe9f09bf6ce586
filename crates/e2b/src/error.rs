//! Errors of the plain-HTTP surfaces (control plane, `/files`, `/health`, interpreter): always
//! `{"code": <http status>, "message"}`, the only shape the E2B SDK parses without crashing.
//! The answers E2B's proxy gives for a sandbox (gone, or its port closed) also name it, as
//! `sandboxId` (and `port`), in E2B's own words.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    pub status: StatusCode,
    pub message: String,
    /// `Retry-After`, seconds (rate limits).
    pub retry_after: Option<u64>,
    /// The sandbox (and port) a proxy answer is about.
    pub about: Option<(String, Option<u16>)>,
}

impl HttpError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            message: message.into(),
            retry_after: None,
            about: None,
        }
    }

    /// An error of the native vocabulary: its status, and its `SANDBOX-...` code leading the
    /// message (E2B's body has no field for it).
    fn coded(code: koder_api_types::ErrorCode, message: impl std::fmt::Display) -> Self {
        Self::new(koder_http::status_of(code), format!("{code}: {message}"))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(401, message)
    }

    /// What E2B's proxy answers for a sandbox that does not exist (any more); the SDK keys
    /// "sandbox not running" on the words "was not found".
    pub fn sandbox_gone(id: &str) -> Self {
        Self {
            about: Some((id.to_owned(), None)),
            ..Self::new(502, "The sandbox was not found")
        }
    }

    /// What E2B's proxy answers for a running sandbox's port that nothing listens on.
    pub fn port_closed(id: &str, port: u16) -> Self {
        Self {
            about: Some((id.to_owned(), Some(port))),
            ..Self::new(502, "The sandbox is running but port is not open")
        }
    }
}

impl From<koder_sessions::Error> for HttpError {
    fn from(e: koder_sessions::Error) -> Self {
        let status = koder_http::status_of(e.code());
        if status == 500 {
            tracing::error!(error = %e, "E2B request failed");
        }
        Self::new(status, e.to_string())
    }
}

/// A native error (its status, its code leading the message).
impl From<koder_http::ApiError> for HttpError {
    fn from(e: koder_http::ApiError) -> Self {
        Self {
            retry_after: e.retry_after,
            ..Self::new(e.status.as_u16(), format!("{}: {}", e.code, e.message))
        }
    }
}

impl From<koder_auth::AuthError> for HttpError {
    fn from(e: koder_auth::AuthError) -> Self {
        Self::coded(e.code(), e)
    }
}

impl From<koder_auth::ScopeDenied> for HttpError {
    fn from(e: koder_auth::ScopeDenied) -> Self {
        Self::coded(e.code(), e)
    }
}

impl From<koder_auth::limits::Limited> for HttpError {
    fn from(e: koder_auth::limits::Limited) -> Self {
        Self {
            retry_after: Some(e.retry_after_secs()),
            ..Self::coded(e.code(), &e)
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut body = json!({"code": self.status.as_u16(), "message": self.message});
        if let Some((id, port)) = self.about {
            body["sandboxId"] = json!(id);
            if let Some(port) = port {
                // A string, as E2B's proxy sends it.
                body["port"] = json!(port.to_string());
            }
        }
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        resp
    }
}

/// An answer given before the request body was read leaves hyper unable to reuse the
/// connection, and a client that reused it anyway would fail its next request: say so.
pub(crate) fn close_connection(resp: &mut Response) {
    resp.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn body_is_code_and_message() {
        let resp = HttpError::new(409, "already paused").into_response();
        assert_eq!(resp.status(), StatusCode::CONFLICT);
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v, json!({"code": 409, "message": "already paused"}));
    }

    #[tokio::test]
    async fn proxy_answers_name_the_sandbox_and_port_as_e2b_does() {
        let body = |e: HttpError| async move {
            let resp = e.into_response();
            assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
            let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
            serde_json::from_slice::<serde_json::Value>(&body).unwrap()
        };
        assert_eq!(
            body(HttpError::sandbox_gone("abc")).await,
            json!({"code": 502, "message": "The sandbox was not found", "sandboxId": "abc"})
        );
        assert_eq!(
            body(HttpError::port_closed("abc", 3000)).await,
            json!({"code": 502, "message": "The sandbox is running but port is not open",
                   "sandboxId": "abc", "port": "3000"})
        );
    }

    #[test]
    fn manager_errors_keep_their_status() {
        let e: HttpError = koder_sessions::Error::NotFound.into();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        let e: HttpError = koder_sessions::Error::FsQuotaExceeded("full".into()).into();
        assert_eq!(e.status.as_u16(), 507);
        assert_eq!(
            HttpError::new(1, "x").status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
