//! Secrets the daemon keeps in its data dir so they outlive a restart (the dev tenant's key, the
//! key of the tokens it derives). Written so no reader ever sees a partial or world-readable
//! file: a private temporary file, synced, then linked into place without replacing a file a
//! concurrent start wrote first.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::Context;

/// The secret in `path` when it holds one `valid` accepts, else a new one from `make`, stored.
pub fn read_or_create(
    path: &Path,
    valid: impl Fn(&str) -> bool,
    make: impl FnOnce() -> String,
) -> anyhow::Result<String> {
    if let Some(existing) = read(path, &valid) {
        return Ok(existing);
    }
    let secret = make();
    let dir = path.parent().context("a key file needs a directory")?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".key-")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)
        .with_context(|| format!("creating a key file in {}", dir.display()))?;
    tmp.write_all(format!("{secret}\n").as_bytes())?;
    tmp.as_file().sync_all()?;
    // A present but unusable file (empty, truncated by a crash of an older version) is replaced;
    // a valid one that appeared meanwhile wins, so two starts agree on one secret.
    if path.exists() {
        if let Some(existing) = read(path, &valid) {
            return Ok(existing);
        }
        tmp.persist(path)
            .with_context(|| format!("replacing {}", path.display()))?;
        return Ok(secret);
    }
    match tmp.persist_noclobber(path) {
        Ok(_) => Ok(secret),
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => read(path, &valid)
            .with_context(|| format!("{} is not a valid key file", path.display())),
        Err(e) => Err(e.error).with_context(|| format!("writing {}", path.display())),
    }
}

fn read(path: &Path, valid: &impl Fn(&str) -> bool) -> Option<String> {
    let raw = std::fs::read_to_string(path).ok()?;
    let trimmed = raw.trim();
    valid(trimmed).then(|| trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long(s: &str) -> bool {
        s.len() >= 8
    }

    #[test]
    fn created_once_private_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let first = read_or_create(&path, long, || "secret-one".into()).unwrap();
        assert_eq!(first, "secret-one");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = read_or_create(&path, long, || "secret-two".into()).unwrap();
        assert_eq!(again, "secret-one");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left");
    }

    #[test]
    fn an_unusable_file_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        for junk in ["", "short", "\n\n"] {
            std::fs::write(&path, junk).unwrap();
            let s = read_or_create(&path, long, || "a-new-secret".into()).unwrap();
            assert_eq!(s, "a-new-secret");
            assert_eq!(std::fs::read_to_string(&path).unwrap(), "a-new-secret\n");
        }
    }
}
