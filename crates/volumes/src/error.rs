use std::io;

use koder_api_types::ErrorCode;
use koder_runtime::RuntimeError;
use rustix::io::Errno;

/// Everything volumes and their file API refuse or fail at. File-level variants carry the
/// volume-absolute path they concern.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("invalid volume id {0:?}: 1 to 64 characters of A-Z, a-z, 0-9 and '-'")]
    InvalidId(String),
    #[error("invalid path {path:?}: {why}")]
    InvalidPath { path: String, why: &'static str },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("volume {0} not found")]
    VolumeNotFound(String),
    #[error("volume {0} already exists")]
    VolumeExists(String),
    #[error("volume {id} is busy: {why}")]
    Busy { id: String, why: &'static str },
    #[error("{0}: no such file or directory")]
    NotFound(String),
    #[error("{0}: already exists")]
    AlreadyExists(String),
    #[error("{0}: not a directory")]
    NotADirectory(String),
    #[error("{0}: is a directory")]
    IsADirectory(String),
    #[error("{0}: not a regular file")]
    NotRegular(String),
    #[error("{0}: too many levels of symbolic links")]
    SymlinkLoop(String),
    #[error("{0}: no space left on the volume")]
    QuotaExceeded(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}: permission denied")]
    PermissionDenied(String),
    #[error("volumes unavailable: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Host(#[from] RuntimeError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl VolumeError {
    /// The API code this failure answers with: a volume in use is `VolumeBusy`, an existing
    /// one or an entry in the way `Conflict`.
    pub fn code(&self) -> ErrorCode {
        match self {
            VolumeError::InvalidId(_)
            | VolumeError::InvalidPath { .. }
            | VolumeError::InvalidArgument(_)
            | VolumeError::SymlinkLoop(_)
            | VolumeError::TooLarge(_) => ErrorCode::InvalidArgument,
            VolumeError::VolumeNotFound(_) | VolumeError::NotFound(_) => ErrorCode::NotFound,
            VolumeError::Busy { .. } => ErrorCode::VolumeBusy,
            VolumeError::VolumeExists(_)
            | VolumeError::AlreadyExists(_)
            | VolumeError::NotADirectory(_)
            | VolumeError::IsADirectory(_)
            | VolumeError::NotRegular(_) => ErrorCode::Conflict,
            VolumeError::QuotaExceeded(_) => ErrorCode::FsQuotaExceeded,
            VolumeError::PermissionDenied(_) => ErrorCode::PermissionDenied,
            VolumeError::Unavailable(_) => ErrorCode::RuntimeUnavailable,
            VolumeError::Host(e) => e.code(),
            VolumeError::Io { .. } => ErrorCode::Internal,
        }
    }

    /// Types an I/O failure on `what` (a volume-absolute path, or a host path for host-side
    /// failures): the errnos a caller can cause become their variants, the rest stay `Io`.
    /// Public so callers writing to a file from [`crate::fs`] get `QuotaExceeded` on a full
    /// volume.
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        let what = what.into();
        match source.raw_os_error().map(Errno::from_raw_os_error) {
            Some(Errno::NOENT) => VolumeError::NotFound(what),
            Some(Errno::EXIST) | Some(Errno::NOTEMPTY) => VolumeError::AlreadyExists(what),
            Some(Errno::NOTDIR) => VolumeError::NotADirectory(what),
            Some(Errno::ISDIR) => VolumeError::IsADirectory(what),
            Some(Errno::LOOP) => VolumeError::SymlinkLoop(what),
            Some(Errno::NOSPC) | Some(Errno::DQUOT) => VolumeError::QuotaExceeded(what),
            Some(Errno::ACCESS) | Some(Errno::PERM) | Some(Errno::XDEV) => {
                VolumeError::PermissionDenied(what)
            }
            Some(Errno::NAMETOOLONG) => VolumeError::InvalidPath {
                path: what,
                why: "a name is too long",
            },
            _ => VolumeError::Io {
                context: what,
                source,
            },
        }
    }

    pub(crate) fn errno(what: impl Into<String>, errno: Errno) -> Self {
        Self::io(what, errno.into())
    }

    /// A host-side failure that is the daemon's own, whatever its errno.
    pub(crate) fn host(context: impl Into<String>) -> impl FnOnce(io::Error) -> Self {
        let context = context.into();
        move |source| VolumeError::Io { context, source }
    }
}
