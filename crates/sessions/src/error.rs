//! Failures of session operations, each with its stable API code and HTTP status.

use koder_agent_protocol::{AgentError, ClientError, ErrorCode};
use koder_api_types::codes;
use koder_runtime::RuntimeError;
use koder_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    /// Unknown id and another tenant's id look exactly alike.
    #[error("session not found")]
    NotFound,
    #[error("{0}")]
    FileNotFound(String),
    #[error("{0}")]
    TenantNotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    FsQuotaExceeded(String),
    #[error("{0}")]
    QuotaSessions(String),
    #[error("{0}")]
    QuotaMinutes(String),
    #[error("{0}")]
    PlanRequired(String),
    #[error("{0}")]
    RuntimeUnavailable(String),
    #[error("{0}")]
    PreviewNotListening(String),
    #[error("{0}")]
    NotImplemented(String),
    /// The session's sandbox died; the message carries the reason it was stopped with.
    #[error("session stopped: {0}")]
    SessionStopped(String),
    #[error("{0}")]
    AgentTimeout(String),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidArgument(_) => codes::INVALID_ARGUMENT,
            Error::NotFound | Error::FileNotFound(_) | Error::TenantNotFound(_) => codes::NOT_FOUND,
            Error::Conflict(_) => codes::CONFLICT,
            Error::PermissionDenied(_) => codes::PERMISSION_DENIED,
            Error::PayloadTooLarge(_) => codes::PAYLOAD_TOO_LARGE,
            Error::FsQuotaExceeded(_) => codes::FS_QUOTA_EXCEEDED,
            Error::QuotaSessions(_) => codes::QUOTA_SESSIONS,
            Error::QuotaMinutes(_) => codes::QUOTA_MINUTES,
            Error::PlanRequired(_) => codes::PLAN_REQUIRED,
            Error::RuntimeUnavailable(_) => codes::RUNTIME_UNAVAILABLE,
            Error::PreviewNotListening(_) => codes::PREVIEW_NOT_LISTENING,
            Error::NotImplemented(_) => codes::NOT_IMPLEMENTED,
            Error::SessionStopped(_) => codes::SESSION_STOPPED,
            Error::AgentTimeout(_) => codes::AGENT_TIMEOUT,
            Error::Internal(_) => codes::INTERNAL,
        }
    }

    pub fn http_status(&self) -> u16 {
        match self {
            Error::InvalidArgument(_) => 400,
            Error::NotFound | Error::FileNotFound(_) | Error::TenantNotFound(_) => 404,
            Error::Conflict(_) => 409,
            Error::PermissionDenied(_) => 403,
            Error::PayloadTooLarge(_) => 413,
            Error::FsQuotaExceeded(_) => 507,
            Error::QuotaSessions(_) | Error::QuotaMinutes(_) => 429,
            Error::PlanRequired(_) => 402,
            Error::RuntimeUnavailable(_) | Error::PreviewNotListening(_) => 503,
            Error::NotImplemented(_) => 501,
            Error::SessionStopped(_) => 410,
            Error::AgentTimeout(_) => 504,
            Error::Internal(_) => 500,
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => Error::NotFound,
            StoreError::Conflict(m) => Error::Conflict(m),
            other => Error::Internal(format!("state store: {other}")),
        }
    }
}

impl From<RuntimeError> for Error {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::InvalidSpec(m) => Error::InvalidArgument(m),
            RuntimeError::Unavailable(m) => Error::RuntimeUnavailable(m),
            RuntimeError::Exhausted(m) => Error::RuntimeUnavailable(m),
            RuntimeError::Agent(c) => c.into(),
            other => Error::Internal(other.to_string()),
        }
    }
}

/// Agent answers about files and processes, in API terms.
impl From<ClientError> for Error {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Agent(a) => a.into(),
            ClientError::Disconnected => Error::SessionStopped(crate::manager::AGENT_EXITED.into()),
            ClientError::Timeout(d) => {
                Error::AgentTimeout(format!("the sandbox did not answer within {d:?}"))
            }
            other => Error::Internal(format!("sandbox agent: {other}")),
        }
    }
}

impl From<AgentError> for Error {
    fn from(a: AgentError) -> Self {
        let m = a.message;
        match a.code {
            ErrorCode::NotFound => Error::FileNotFound(m),
            ErrorCode::AlreadyExists
            | ErrorCode::NotADirectory
            | ErrorCode::IsADirectory
            | ErrorCode::DirectoryNotEmpty => Error::Conflict(m),
            ErrorCode::PermissionDenied => Error::PermissionDenied(m),
            ErrorCode::InvalidPath | ErrorCode::InvalidRequest | ErrorCode::SpawnFailed => {
                Error::InvalidArgument(m)
            }
            ErrorCode::NoSpace => Error::FsQuotaExceeded(m),
            ErrorCode::TooLarge => Error::PayloadTooLarge(m),
            ErrorCode::Io => Error::Internal(m),
        }
    }
}
