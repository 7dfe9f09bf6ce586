//! Errors on the gRPC wire: every `SANDBOX-...` code maps to the status code that matches its
//! REST status; the message starts with the code, and the details carry it as a
//! `google.rpc.ErrorInfo` (plus a `google.rpc.RetryInfo` for rate limits).

use std::time::Duration;

use koder_api_types::ErrorCode;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

/// `ErrorInfo.domain` of every error this service returns.
pub const ERROR_DOMAIN: &str = "sandbox.koder.ai";

/// The gRPC code of an API error code (its REST status in the comments).
pub fn code_of(code: ErrorCode) -> Code {
    match code {
        // 400, 413, 415: the request itself is wrong.
        ErrorCode::InvalidArgument
        | ErrorCode::NetworkRule
        | ErrorCode::WebhookUrlRefused
        | ErrorCode::PayloadTooLarge
        | ErrorCode::UnsupportedMediaType
        | ErrorCode::ImageBuildInvalidSpec => Code::InvalidArgument,
        ErrorCode::Auth | ErrorCode::NodeAuth => Code::Unauthenticated,
        // 402 (plan `none`), 403.
        ErrorCode::PlanRequired | ErrorCode::PermissionDenied | ErrorCode::AuthScope => {
            Code::PermissionDenied
        }
        ErrorCode::NotFound
        | ErrorCode::ImageNotFound
        | ErrorCode::SecretNotFound
        | ErrorCode::ImageBuildNotFound => Code::NotFound,
        ErrorCode::ImageBuildStepFailed => Code::Aborted,
        // 409 and 410: the session or resource is not in a state that allows it.
        ErrorCode::Conflict
        | ErrorCode::VolumeBusy
        | ErrorCode::ImageInUse
        | ErrorCode::SessionStopped => Code::FailedPrecondition,
        // 429 and 507.
        ErrorCode::QuotaSessions
        | ErrorCode::QuotaMinutes
        | ErrorCode::RateLimited
        | ErrorCode::FsQuotaExceeded
        | ErrorCode::QuotaSnapshotStorage
        | ErrorCode::QuotaVolumeStorage => Code::ResourceExhausted,
        ErrorCode::Internal | ErrorCode::ImageBuildFailed => Code::Internal,
        ErrorCode::NotImplemented => Code::Unimplemented,
        ErrorCode::RuntimeUnavailable
        | ErrorCode::PreviewNotListening
        | ErrorCode::ImageNotReady
        | ErrorCode::NodeUnreachable => Code::Unavailable,
        ErrorCode::AgentTimeout => Code::DeadlineExceeded,
    }
}

/// The status of a failed call: `"<SANDBOX-code>: <message>"` with the code as `ErrorInfo`.
pub fn status(code: ErrorCode, message: &str, retry_after: Option<Duration>) -> Status {
    let mut details = ErrorDetails::with_error_info(
        code.as_str(),
        ERROR_DOMAIN,
        std::collections::HashMap::<String, String>::new(),
    );
    if let Some(delay) = retry_after {
        details.set_retry_info(Some(delay));
    }
    Status::with_error_details(
        code_of(code),
        format!("{}: {message}", code.as_str()),
        details,
    )
}

/// An error that has a `SANDBOX-...` code.
pub trait ToStatus {
    fn to_status(&self) -> Status;
}

impl ToStatus for koder_sessions::Error {
    fn to_status(&self) -> Status {
        let code = self.code();
        if code == ErrorCode::Internal {
            tracing::error!(error = %self, "gRPC call failed");
        }
        status(code, &self.to_string(), None)
    }
}

impl ToStatus for koder_auth::AuthError {
    fn to_status(&self) -> Status {
        tracing::debug!(error = %self, "gRPC authentication failed");
        status(self.code(), &self.to_string(), None)
    }
}

impl ToStatus for koder_auth::ScopeDenied {
    fn to_status(&self) -> Status {
        status(self.code(), &self.to_string(), None)
    }
}

impl ToStatus for koder_auth::limits::Limited {
    fn to_status(&self) -> Status {
        let secs = Duration::from_secs(self.retry_after_secs());
        status(self.code(), &self.to_string(), Some(secs))
    }
}

/// `?` for results whose error has a code.
pub(crate) trait OrStatus<T> {
    fn or_status(self) -> Result<T, Status>;
}

impl<T, E: ToStatus> OrStatus<T> for Result<T, E> {
    fn or_status(self) -> Result<T, Status> {
        self.map_err(|e| e.to_status())
    }
}

/// The `SANDBOX-...` code a status carries in its details (clients and tests read it back).
pub fn sandbox_code(status: &Status) -> Option<String> {
    status.get_details_error_info().map(|info| info.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_rest_statuses() {
        let cases = [
            (ErrorCode::InvalidArgument, Code::InvalidArgument),
            (ErrorCode::Auth, Code::Unauthenticated),
            (ErrorCode::AuthScope, Code::PermissionDenied),
            (ErrorCode::NotFound, Code::NotFound),
            (ErrorCode::QuotaSessions, Code::ResourceExhausted),
            (ErrorCode::RateLimited, Code::ResourceExhausted),
            (ErrorCode::NotImplemented, Code::Unimplemented),
            (ErrorCode::RuntimeUnavailable, Code::Unavailable),
            (ErrorCode::WebhookUrlRefused, Code::InvalidArgument),
        ];
        for (code, grpc) in cases {
            assert_eq!(code_of(code), grpc, "{code}");
        }
    }

    #[test]
    fn the_sandbox_code_is_in_message_and_details() {
        let s = status(
            ErrorCode::RateLimited,
            "slow down",
            Some(Duration::from_secs(2)),
        );
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(s.message(), "SANDBOX-RATE-LIMITED: slow down");
        assert_eq!(sandbox_code(&s).as_deref(), Some("SANDBOX-RATE-LIMITED"));
        let info = s.get_details_error_info().unwrap();
        assert_eq!(info.domain, ERROR_DOMAIN);
        let retry = s.get_details_retry_info().unwrap();
        assert_eq!(retry.retry_delay, Some(Duration::from_secs(2)));
    }
}
