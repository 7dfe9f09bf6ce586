use std::io;
use std::path::PathBuf;
use std::time::Duration;

use koder_api_types::ErrorCode;

/// Every failure the crate reports. Variants carry the path involved so a
/// log line is actionable without a backtrace.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("invalid cgroup name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },

    #[error("invalid pid {0}")]
    InvalidPid(u32),

    #[error("invalid limit: {0}")]
    InvalidLimit(String),

    #[error("no usable cgroup hierarchy: {0}")]
    NoHierarchy(String),

    #[error("cgroup already exists: {}", path.display())]
    AlreadyExists { path: PathBuf },

    #[error("cgroup not found: {}", path.display())]
    NotFound { path: PathBuf },

    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("cannot parse {}: {detail}", path.display())]
    Parse { path: PathBuf, detail: String },

    #[error("{what} is not supported here ({})", path.display())]
    Unsupported { what: &'static str, path: PathBuf },

    #[error("timed out after {waited:?} waiting for {what} ({})", path.display())]
    Timeout {
        what: &'static str,
        path: PathBuf,
        waited: Duration,
    },

    #[error("sending SIGKILL to pid {pid}: {source}")]
    Signal {
        pid: u32,
        #[source]
        source: nix::errno::Errno,
    },
}

impl CgroupError {
    /// The API code of this failure; match on the variant for finer distinctions. A host
    /// without a usable hierarchy cannot run sandboxes (`RuntimeUnavailable`); a controller
    /// this host lacks is a capability not offered (`NotImplemented`).
    pub fn code(&self) -> ErrorCode {
        match self {
            CgroupError::InvalidName { .. }
            | CgroupError::InvalidPid(_)
            | CgroupError::InvalidLimit(_) => ErrorCode::InvalidArgument,
            CgroupError::NoHierarchy(_) => ErrorCode::RuntimeUnavailable,
            CgroupError::AlreadyExists { .. } => ErrorCode::Conflict,
            CgroupError::NotFound { .. } => ErrorCode::NotFound,
            CgroupError::Unsupported { .. } => ErrorCode::NotImplemented,
            CgroupError::Io { .. }
            | CgroupError::Parse { .. }
            | CgroupError::Timeout { .. }
            | CgroupError::Signal { .. } => ErrorCode::Internal,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        CgroupError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
