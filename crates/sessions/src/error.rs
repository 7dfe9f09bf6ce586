//! Failures of session operations, each with its stable API code (the transports map codes
//! to their wire; runtime, store and agent errors are mapped into these here).

use koder_agent_protocol::{AgentError, ClientError, ErrorCode as AgentCode};
use koder_api_types::ErrorCode;
use koder_runtime::RuntimeError;
use koder_store::StoreError;

/// The end reason of a session whose agent went away (killed, crashed, or the VM died).
pub const AGENT_EXITED: &str = "agent exited";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    /// What the request needs lives on another node of the cluster that is not up.
    #[error("{0}")]
    NodeUnreachable(String),
    /// The user named is no account of the sandbox.
    #[error("no account {0:?} in the sandbox")]
    UnknownAccount(String),
    /// Unknown id and another tenant's id look exactly alike.
    #[error("session not found")]
    NotFound,
    #[error("{0}")]
    FileNotFound(String),
    #[error("{0}")]
    TenantNotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// Stdin or a signal for an exec that has ended: a conflict on the native faces, while
    /// E2B's envd answers "not found" for a process that is gone (its CLI relies on it).
    #[error("the exec has already exited")]
    ExecExited,
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
    /// The tenant's snapshot storage has no room for this capture.
    #[error("{0}")]
    QuotaSnapshotStorage(String),
    #[error("snapshot not found")]
    SnapshotNotFound,
    #[error("volume not found")]
    VolumeNotFound,
    /// Mounted by a session, or mounted read-write already.
    #[error("{0}")]
    VolumeBusy(String),
    /// The tenant's volumes have no room for this one.
    #[error("{0}")]
    QuotaVolumeStorage(String),
    #[error("{0}")]
    ImageNotFound(String),
    /// A session (running or paused) or a warm pool uses it.
    #[error("{0}")]
    ImageInUse(String),
    /// A network allow/deny entry the server refuses.
    #[error(transparent)]
    NetworkRule(#[from] koder_netpolicy::PolicyError),
    #[error("secret {0:?} not found")]
    SecretNotFound(String),
    /// The image's ready command did not pass in time: the session was not handed out.
    #[error("{0}")]
    ImageNotReady(String),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// The stable API code; transports derive their wire status from it.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::InvalidArgument(_) | Error::UnknownAccount(_) => ErrorCode::InvalidArgument,
            Error::NotFound | Error::FileNotFound(_) | Error::TenantNotFound(_) => {
                ErrorCode::NotFound
            }
            Error::Conflict(_) | Error::ExecExited => ErrorCode::Conflict,
            Error::PermissionDenied(_) => ErrorCode::PermissionDenied,
            Error::PayloadTooLarge(_) => ErrorCode::PayloadTooLarge,
            Error::FsQuotaExceeded(_) => ErrorCode::FsQuotaExceeded,
            Error::QuotaSessions(_) => ErrorCode::QuotaSessions,
            Error::QuotaMinutes(_) => ErrorCode::QuotaMinutes,
            Error::PlanRequired(_) => ErrorCode::PlanRequired,
            Error::RuntimeUnavailable(_) => ErrorCode::RuntimeUnavailable,
            Error::NodeUnreachable(_) => ErrorCode::NodeUnreachable,
            Error::PreviewNotListening(_) => ErrorCode::PreviewNotListening,
            Error::NotImplemented(_) => ErrorCode::NotImplemented,
            Error::SessionStopped(_) => ErrorCode::SessionStopped,
            Error::AgentTimeout(_) => ErrorCode::AgentTimeout,
            Error::QuotaSnapshotStorage(_) => ErrorCode::QuotaSnapshotStorage,
            Error::SnapshotNotFound | Error::VolumeNotFound => ErrorCode::NotFound,
            Error::VolumeBusy(_) => ErrorCode::VolumeBusy,
            Error::QuotaVolumeStorage(_) => ErrorCode::QuotaVolumeStorage,
            Error::ImageNotFound(_) => ErrorCode::ImageNotFound,
            Error::ImageInUse(_) => ErrorCode::ImageInUse,
            Error::ImageNotReady(_) => ErrorCode::ImageNotReady,
            Error::NetworkRule(_) => ErrorCode::NetworkRule,
            Error::SecretNotFound(_) => ErrorCode::SecretNotFound,
            Error::Internal(_) => ErrorCode::Internal,
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => Error::NotFound,
            StoreError::Conflict(m) => Error::Conflict(m),
            StoreError::UnknownTenant(t) => Error::TenantNotFound(format!("unknown tenant {t:?}")),
            StoreError::Invalid(m) => Error::InvalidArgument(m),
            other => Error::Internal(format!("state store: {other}")),
        }
    }
}

impl From<RuntimeError> for Error {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::InvalidSpec(m) => Error::InvalidArgument(m),
            RuntimeError::Unsupported(m) => Error::NotImplemented(m),
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
            ClientError::Disconnected => Error::SessionStopped(AGENT_EXITED.into()),
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
            AgentCode::NotFound => Error::FileNotFound(m),
            AgentCode::AlreadyExists
            | AgentCode::NotADirectory
            | AgentCode::IsADirectory
            | AgentCode::DirectoryNotEmpty => Error::Conflict(m),
            AgentCode::PermissionDenied => Error::PermissionDenied(m),
            AgentCode::InvalidPath | AgentCode::InvalidRequest | AgentCode::SpawnFailed => {
                Error::InvalidArgument(m)
            }
            AgentCode::NoSpace => Error::FsQuotaExceeded(m),
            AgentCode::TooLarge => Error::PayloadTooLarge(m),
            AgentCode::Io => Error::Internal(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Agent failures get the same code whether the runtime or the manager maps them.
    #[test]
    fn agent_errors_map_like_the_runtime_maps_them() {
        let codes = [
            AgentCode::NotFound,
            AgentCode::AlreadyExists,
            AgentCode::NotADirectory,
            AgentCode::IsADirectory,
            AgentCode::DirectoryNotEmpty,
            AgentCode::PermissionDenied,
            AgentCode::InvalidPath,
            AgentCode::InvalidRequest,
            AgentCode::NoSpace,
            AgentCode::TooLarge,
            AgentCode::SpawnFailed,
            AgentCode::Io,
        ];
        let mut errors: Vec<ClientError> = codes
            .into_iter()
            .map(|c| ClientError::Agent(AgentError::new(c, "x")))
            .collect();
        errors.push(ClientError::Disconnected);
        errors.push(ClientError::Timeout(std::time::Duration::from_secs(1)));
        errors.push(ClientError::Protocol("x".into()));
        for e in errors {
            let want = koder_runtime::agent_code(&e);
            let shown = format!("{e:?}");
            assert_eq!(Error::from(e).code(), want, "{shown}");
        }
    }

    #[test]
    fn store_errors_keep_the_store_codes() {
        for e in [
            StoreError::NotFound,
            StoreError::Conflict("x".into()),
            StoreError::UnknownTenant("t".into()),
            StoreError::Invalid("x".into()),
            StoreError::Corrupt("x".into()),
        ] {
            let want = e.code();
            assert_eq!(Error::from(e).code(), want);
        }
    }
}
