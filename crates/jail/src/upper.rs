//! The directories sandbox code writes to, made in a sandbox's upper layer: the image's own
//! copies belong to the host (or to nobody, in the sandbox's eyes), so without these its root
//! could not write to `/tmp`, `/root` or `/workspace`, nor its user to its home.

use std::io;
use std::os::unix::fs::{chown, PermissionsExt};
use std::path::Path;

use koder_image::UPPER_DIRS;

/// The sandbox user's home, below `home`.
const USER_HOME: &str = "home/user";

/// Makes them under `upper`, owned by whoever makes them, with their modes (`root` private,
/// `tmp` and `var/tmp` sticky and open to all).
pub fn make(upper: &Path) -> io::Result<()> {
    for sub in UPPER_DIRS.iter().chain([&USER_HOME]) {
        std::fs::create_dir_all(upper.join(sub))?;
    }
    let modes = [("root", 0o700), ("tmp", 0o1777), ("var/tmp", 0o1777)];
    for (sub, mode) in modes {
        std::fs::set_permissions(upper.join(sub), std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Gives them to the sandbox: to `root` (the host id of its root) and its user's home to
/// `user`; `None` leaves them as they are (a rootless runtime has no other ids).
pub fn give(upper: &Path, root: Option<u32>, user: Option<u32>) -> io::Result<()> {
    for sub in UPPER_DIRS {
        chown(upper.join(sub), root, root)?;
    }
    chown(upper.join(USER_HOME), user, user)
}

/// Removes what [`make`] made (empty still), deepest first.
pub fn remove(upper: &Path) -> io::Result<()> {
    for sub in UPPER_DIRS.iter().chain([&USER_HOME]).rev() {
        match std::fs::remove_dir(upper.join(sub)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn made_with_their_modes_given_and_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let upper = dir.path();
        make(upper).expect("make");
        let mode = |sub: &str| std::fs::metadata(upper.join(sub)).unwrap().mode() & 0o7777;
        assert_eq!(mode("root"), 0o700);
        assert_eq!(mode("tmp"), 0o1777);
        assert_eq!(mode("var/tmp"), 0o1777);
        for sub in UPPER_DIRS.iter().chain([&USER_HOME]) {
            assert!(upper.join(sub).is_dir(), "{sub}");
        }
        if rustix::process::geteuid().is_root() {
            give(upper, Some(4_000_000), Some(4_001_000)).expect("give");
            let owner = |sub: &str| std::fs::metadata(upper.join(sub)).unwrap().uid();
            assert_eq!(owner("workspace"), 4_000_000);
            assert_eq!(owner("var/tmp"), 4_000_000);
            assert_eq!(owner(USER_HOME), 4_001_000);
            // Ownership changes keep the sticky bit.
            assert_eq!(mode("tmp"), 0o1777);
        }
        remove(upper).expect("remove");
        assert_eq!(std::fs::read_dir(upper).unwrap().count(), 0);
    }
}
