use std::io;
use std::path::PathBuf;
use std::time::Duration;

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
    /// Stable, machine-readable identifier; safe to expose over an API and
    /// match on, unlike the Display text.
    pub fn code(&self) -> &'static str {
        match self {
            CgroupError::InvalidName { .. } => "cgroup_invalid_name",
            CgroupError::InvalidPid(_) => "cgroup_invalid_pid",
            CgroupError::InvalidLimit(_) => "cgroup_invalid_limit",
            CgroupError::NoHierarchy(_) => "cgroup_no_hierarchy",
            CgroupError::AlreadyExists { .. } => "cgroup_already_exists",
            CgroupError::NotFound { .. } => "cgroup_not_found",
            CgroupError::Io { .. } => "cgroup_io",
            CgroupError::Parse { .. } => "cgroup_parse",
            CgroupError::Unsupported { .. } => "cgroup_unsupported",
            CgroupError::Timeout { .. } => "cgroup_timeout",
            CgroupError::Signal { .. } => "cgroup_signal",
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
