//! Directory and file modes: sandbox uids (and VMM uids) reach what the daemon prepares only
//! through paths whose every ancestor lets them pass.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use koder_runtime::RuntimeError;

pub fn set_mode(path: &Path, mode: u32) -> Result<(), RuntimeError> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(RuntimeError::io(format!("chmod {}", path.display())))
}

/// `Unavailable` unless every ancestor of `path` is searchable by others: an unprivileged uid
/// cannot reach anything below a directory it cannot search, however open the rest is.
pub fn check_traversable(path: &Path) -> Result<(), RuntimeError> {
    let abs = std::fs::canonicalize(path)
        .map_err(RuntimeError::io(format!("resolve {}", path.display())))?;
    for dir in abs.ancestors() {
        let mode = std::fs::metadata(dir)
            .map_err(RuntimeError::io(format!("stat {}", dir.display())))?
            .permissions()
            .mode();
        if mode & 0o001 == 0 {
            return Err(RuntimeError::Unavailable(format!(
                "{} is not searchable by sandbox uids (mode {:o}); choose a state dir and agent path under world-searchable directories",
                dir.display(),
                mode & 0o7777
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_ancestor_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let inner = tmp.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        set_mode(tmp.path(), 0o711).unwrap();
        set_mode(&tmp.path().join("a"), 0o711).unwrap();
        // tempdir's own ancestors (/tmp, /) are world-searchable on any sane host.
        check_traversable(&inner).unwrap();
        set_mode(&tmp.path().join("a"), 0o710).unwrap();
        let err = check_traversable(&inner).unwrap_err();
        assert!(matches!(err, RuntimeError::Unavailable(_)), "{err}");
        assert!(err.to_string().contains("/a is not searchable"), "{err}");
        assert!(set_mode(&tmp.path().join("missing"), 0o700).is_err());
    }
}
