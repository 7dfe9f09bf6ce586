//! Every non-2xx answer is `{"error": {"code", "message", "details"?}}` (API.md "Errors").

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use koder_api_types::{codes, ErrorBody, ErrorCode, ErrorDetail};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// `Retry-After`, seconds (rate limits).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    fn of(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::new(status_of(code), code.as_str(), message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(400, codes::INVALID_ARGUMENT, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(401, codes::AUTH, message)
    }
}

/// The HTTP status of an API error code (API.md "Errors").
pub fn status_of(code: ErrorCode) -> u16 {
    match code {
        ErrorCode::InvalidArgument
        | ErrorCode::NetworkRule
        | ErrorCode::WebhookUrlRefused
        | ErrorCode::ImageBuildInvalidSpec => 400,
        ErrorCode::Auth | ErrorCode::NodeAuth => 401,
        ErrorCode::PlanRequired => 402,
        ErrorCode::PermissionDenied | ErrorCode::AuthScope => 403,
        ErrorCode::NotFound
        | ErrorCode::ImageNotFound
        | ErrorCode::SecretNotFound
        | ErrorCode::ImageBuildNotFound => 404,
        // Build verdicts, only ever in a build's status.
        ErrorCode::ImageBuildStepFailed => 422,
        ErrorCode::ImageBuildFailed => 500,
        ErrorCode::Conflict | ErrorCode::VolumeBusy | ErrorCode::ImageInUse => 409,
        ErrorCode::SessionStopped => 410,
        ErrorCode::PayloadTooLarge => 413,
        ErrorCode::UnsupportedMediaType => 415,
        ErrorCode::QuotaSessions | ErrorCode::QuotaMinutes | ErrorCode::RateLimited => 429,
        ErrorCode::Internal => 500,
        ErrorCode::NotImplemented => 501,
        ErrorCode::NodeUnreachable => 502,
        ErrorCode::RuntimeUnavailable
        | ErrorCode::PreviewNotListening
        | ErrorCode::ImageNotReady => 503,
        ErrorCode::AgentTimeout => 504,
        ErrorCode::FsQuotaExceeded
        | ErrorCode::QuotaSnapshotStorage
        | ErrorCode::QuotaVolumeStorage => 507,
    }
}

impl From<koder_sessions::Error> for ApiError {
    fn from(e: koder_sessions::Error) -> Self {
        let code = e.code();
        if code == ErrorCode::Internal {
            tracing::error!(error = %e, "request failed");
        }
        Self::new(status_of(code), code.as_str(), e.to_string())
    }
}

impl From<koder_auth::AuthError> for ApiError {
    fn from(e: koder_auth::AuthError) -> Self {
        Self::of(e.code(), e.to_string())
    }
}

impl From<koder_auth::ScopeDenied> for ApiError {
    fn from(e: koder_auth::ScopeDenied) -> Self {
        Self::of(e.code(), e.to_string())
    }
}

impl From<koder_auth::limits::Limited> for ApiError {
    fn from(e: koder_auth::limits::Limited) -> Self {
        Self {
            retry_after: Some(e.retry_after_secs()),
            ..Self::of(e.code(), e.to_string())
        }
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
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use koder_sessions::Error;

    #[test]
    fn domain_errors_keep_their_code_and_status() {
        let cases = [
            (
                Error::InvalidArgument("x".into()),
                400,
                codes::INVALID_ARGUMENT,
            ),
            (Error::PlanRequired("x".into()), 402, codes::PLAN_REQUIRED),
            (Error::NotFound, 404, codes::NOT_FOUND),
            (Error::TenantNotFound("x".into()), 404, codes::NOT_FOUND),
            (
                Error::SessionStopped("x".into()),
                410,
                codes::SESSION_STOPPED,
            ),
            (Error::QuotaMinutes("x".into()), 429, codes::QUOTA_MINUTES),
            (
                Error::PreviewNotListening("x".into()),
                503,
                codes::PREVIEW_NOT_LISTENING,
            ),
            (Error::AgentTimeout("x".into()), 504, codes::AGENT_TIMEOUT),
            (
                Error::FsQuotaExceeded("x".into()),
                507,
                codes::FS_QUOTA_EXCEEDED,
            ),
        ];
        for (e, status, code) in cases {
            let api = ApiError::from(e);
            assert_eq!((api.status.as_u16(), api.code), (status, code));
        }
    }
}
