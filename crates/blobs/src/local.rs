//! What only the local directory needs: durability (object_store does not fsync) and the
//! removal of staging files a crashed daemon left.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use crate::names::TENANTS;

/// Makes a completed object survive a power cut: its data, and the directory entries from
/// its own up to the root (a put may have created the directories).
pub(crate) fn sync(root: &Path, file: &Path) -> io::Result<()> {
    File::open(file)?.sync_all()?;
    let mut dir = file.parent();
    while let Some(d) = dir {
        File::open(d)?.sync_all()?;
        if d == root {
            break;
        }
        dir = d.parent();
    }
    Ok(())
}

/// `LocalFileSystem` stages an upload of `dest` as `dest#<digits>` and renames it when
/// complete. Keys never contain `#`, so such a name is always a staging file.
fn staging_target(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let (base, suffix) = name.rsplit_once('#')?;
    let digits = !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| path.with_file_name(base))
}

/// Removes staging files under `root` except those of uploads to `live` destinations (this
/// process's own uploads in progress). Returns how many went.
pub(crate) fn sweep_staging(root: &Path, live: &HashSet<PathBuf>) -> io::Result<u64> {
    let mut removed = 0;
    for entry in walkdir::WalkDir::new(root.join(TENANTS)) {
        let entry = match entry {
            Ok(entry) => entry,
            // No tenants yet, or a directory that went away while walking.
            Err(e) if e.io_error().map(io::Error::kind) == Some(io::ErrorKind::NotFound) => {
                continue
            }
            Err(e) => return Err(e.into()),
        };
        if !entry.file_type().is_file() {
            continue;
        }
        let Some(dest) = staging_target(entry.path()) else {
            continue;
        };
        if live.contains(&dest) {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_names() {
        let p = Path::new("/r/tenants/a/snap#12");
        assert_eq!(staging_target(p), Some(PathBuf::from("/r/tenants/a/snap")));
        for not in [
            "/r/tenants/a/snap",
            "/r/tenants/a/snap#",
            "/r/tenants/a/snap#1x",
        ] {
            assert_eq!(staging_target(Path::new(not)), None, "{not}");
        }
    }
}
