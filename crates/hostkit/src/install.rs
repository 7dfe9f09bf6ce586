//! Installing a binary where unprivileged sandbox or VMM uids can execute it, wherever it was
//! built (`cargo` puts binaries under root's home, which those uids cannot search).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use koder_runtime::RuntimeError;

/// Copies `source` to `dir/name`, mode 0755, unless a copy as long and at least as new is there
/// already. The copy is staged in `dir` and renamed over the target: a process started from the
/// previous copy keeps running it, and nothing ever executes a half-written file. `dir` is
/// created if missing; its mode is the caller's business.
///
/// Every failure is `Unavailable`: installs happen while a runtime starts, and a runtime without
/// its binaries cannot run at all.
pub fn install_executable(source: &Path, dir: &Path, name: &str) -> Result<PathBuf, RuntimeError> {
    let fail = |what: &str| {
        let what = format!("{}: {what}", source.display());
        move |e: std::io::Error| RuntimeError::Unavailable(format!("{what}: {e}"))
    };
    let meta = std::fs::metadata(source).map_err(fail("stat"))?;
    if !meta.is_file() {
        return Err(RuntimeError::Unavailable(format!(
            "{} is not a file",
            source.display()
        )));
    }
    let target = dir.join(name);
    let current = std::fs::metadata(&target)
        .is_ok_and(|t| t.len() == meta.len() && t.modified().ok() >= meta.modified().ok());
    if current {
        return Ok(target);
    }
    std::fs::create_dir_all(dir).map_err(fail(&format!("create {}", dir.display())))?;
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .tempfile_in(dir)
        .map_err(fail("stage a copy"))?;
    std::fs::copy(source, staging.path()).map_err(fail("copy"))?;
    std::fs::set_permissions(staging.path(), std::fs::Permissions::from_mode(0o755))
        .map_err(fail("chmod the copy"))?;
    staging
        .persist(&target)
        .map_err(|e| fail(&format!("rename onto {}", target.display()))(e.error))?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn installs_by_rename_and_only_when_changed() {
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("tool");
        std::fs::write(&source, b"version one").unwrap();
        let bin = tmp.path().join("bin");

        let target = install_executable(&source, &bin, "tool").unwrap();
        assert_eq!(target, bin.join("tool"));
        let first = std::fs::metadata(&target).unwrap();
        assert_eq!(first.mode() & 0o7777, 0o755);
        assert_eq!(std::fs::read(&target).unwrap(), b"version one");

        // Unchanged source: the installed file is left alone (same inode).
        install_executable(&source, &bin, "tool").unwrap();
        assert_eq!(std::fs::metadata(&target).unwrap().ino(), first.ino());

        // A reader of the old copy (a running process) keeps it whole; the new one is a new
        // inode, and no staging file is left behind.
        let mut old = std::fs::File::open(&target).unwrap();
        std::fs::write(&source, b"version two, longer").unwrap();
        install_executable(&source, &bin, "tool").unwrap();
        let second = std::fs::metadata(&target).unwrap();
        assert_ne!(second.ino(), first.ino());
        assert_eq!(std::fs::read(&target).unwrap(), b"version two, longer");
        let mut kept = String::new();
        old.read_to_string(&mut kept).unwrap();
        assert_eq!(kept, "version one");
        let names: Vec<_> = std::fs::read_dir(&bin)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["tool"]);
    }

    #[test]
    fn refuses_what_is_not_a_file() {
        let tmp = tempfile::tempdir().unwrap();
        for source in [tmp.path().to_path_buf(), tmp.path().join("missing")] {
            let err = install_executable(&source, &tmp.path().join("bin"), "x").unwrap_err();
            assert!(matches!(err, RuntimeError::Unavailable(_)), "{err}");
        }
        assert!(!tmp.path().join("bin/x").exists());
    }
}
