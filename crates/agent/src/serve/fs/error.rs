//! Failures of file operations as agent errors: errno to code, messages naming the request path.

use koder_agent_protocol::{AgentError, ErrorCode};
use rustix::io::Errno;

pub(super) fn code_of(e: Errno) -> ErrorCode {
    match e {
        Errno::NOENT => ErrorCode::NotFound,
        Errno::EXIST => ErrorCode::AlreadyExists,
        Errno::NOTDIR => ErrorCode::NotADirectory,
        Errno::ISDIR => ErrorCode::IsADirectory,
        Errno::NOTEMPTY => ErrorCode::DirectoryNotEmpty,
        Errno::ACCESS | Errno::PERM | Errno::ROFS => ErrorCode::PermissionDenied,
        Errno::NOSPC | Errno::DQUOT => ErrorCode::NoSpace,
        Errno::NAMETOOLONG | Errno::LOOP | Errno::XDEV | Errno::INVAL => ErrorCode::InvalidPath,
        Errno::FBIG => ErrorCode::TooLarge,
        _ => ErrorCode::Io,
    }
}

pub(super) fn describe(e: Errno) -> String {
    match e {
        Errno::LOOP => "too many levels of symbolic links, or a /proc magic link".to_owned(),
        Errno::XDEV => "path escapes the sandbox root".to_owned(),
        _ => std::io::Error::from_raw_os_error(e.raw_os_error()).to_string(),
    }
}

pub(super) fn errno_err(op: &str, path: &str, e: Errno) -> AgentError {
    AgentError::new(code_of(e), format!("{op} {}: {}", shown(path), describe(e)))
}

pub(super) fn io_err(op: &str, path: &str, e: &std::io::Error) -> AgentError {
    match Errno::from_io_error(e) {
        Some(errno) => errno_err(op, path, errno),
        None => AgentError::new(ErrorCode::Io, format!("{op} {}: {e}", shown(path))),
    }
}

pub(super) fn invalid(op: &str, path: &str, why: &str) -> AgentError {
    AgentError::new(
        ErrorCode::InvalidPath,
        format!("{op} {}: {why}", shown(path)),
    )
}

pub(super) fn is_a_directory(op: &str, path: &str) -> AgentError {
    AgentError::new(
        ErrorCode::IsADirectory,
        format!("{op} {}: is a directory", shown(path)),
    )
}

pub(super) fn not_a_dir_in_the_way(op: &str, path: &str, last: bool) -> AgentError {
    if last {
        AgentError::new(
            ErrorCode::AlreadyExists,
            format!("{op} {}: exists and is not a directory", shown(path)),
        )
    } else {
        AgentError::new(
            ErrorCode::NotADirectory,
            format!("{op} {}: not a directory", shown(path)),
        )
    }
}

/// A path as shown in messages: escaped, and cut when long.
pub(super) fn shown(path: &str) -> String {
    const MAX_CHARS: usize = 256;
    if path.chars().count() > MAX_CHARS {
        let head: String = path.chars().take(MAX_CHARS).collect();
        format!("{head:?}...")
    } else {
        format!("{path:?}")
    }
}
