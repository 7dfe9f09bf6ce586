//! What every image root tree gets: its directories, accounts and resolver files, and (for
//! trees made from packages, archives or template steps) the clean-up that makes it safe to
//! share read-only among sandboxes.

mod accounts;

pub(crate) use accounts::shadow_of;
pub use accounts::{account_in_tree, find_account, valid_name, Account};

use std::io;
use std::os::unix::fs::{lchown, MetadataExt, PermissionsExt};
use std::path::Path;

use koder_runtime::SANDBOX_IDS;

use crate::ROOT_DIRS;

pub(crate) const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
user:x:1000:1000:user:/home/user:/bin/bash\n\
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
pub(crate) const GROUP: &str = "root:x:0:\ntty:x:5:\nuser:x:1000:\nnogroup:x:65534:\n";
const HOSTS: &str = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n";
const NSSWITCH: &str = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n";
const RESOLV: &str = "# koder-sandbox: name resolution follows the session's network policy\n";

/// The resolver files every root gets (mode 0644), whatever its tree held.
const RESOLVER: &[(&str, &str)] = &[
    ("hosts", HOSTS),
    ("nsswitch.conf", NSSWITCH),
    ("resolv.conf", RESOLV),
    ("hostname", "sandbox\n"),
];

/// Files of a package-built /etc no sandbox gets: backups of the account files and group
/// passwords, the build host's identity, and the package manager's state.
const REMOVED: &[&str] = &[
    "etc/shadow-",
    "etc/gshadow",
    "etc/gshadow-",
    "etc/passwd-",
    "etc/group-",
    "etc/subuid",
    "etc/subgid",
    "etc/machine-id",
    "var/lib/dbus/machine-id",
    "etc/ssh",
    "var/cache/apt",
    "var/cache/debconf",
    "var/lib/apt/lists",
    "var/log",
];

/// Directories [`sanitize`] reaches by path (to make, empty or clean below): in a tree from an
/// untrusted archive, any of them may be a symlink, which sanitizing would follow.
const SANITIZED_DIRS: &[&str] = &[
    "sys",
    "var/cache",
    "var/lib",
    "var/lib/apt",
    "var/lib/dbus",
    "var/log",
];

/// Replaces every directory [`sanitize`] works in that is a symlink or no directory (a tree
/// unpacked from an archive may have anything there) by nothing, so sanitizing makes it a
/// fresh directory instead of following it out of the tree. Returns what it removed.
pub(crate) fn unlink_symlinked_dirs(root: &Path) -> io::Result<Vec<String>> {
    let mut removed = Vec::new();
    for dir in ROOT_DIRS.iter().chain(SANITIZED_DIRS) {
        let mut at = root.to_path_buf();
        for part in dir.split('/') {
            at.push(part);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.is_dir() => continue,
                Ok(_) => {
                    std::fs::remove_file(&at)?;
                    removed.push(at.strip_prefix(root).unwrap_or(&at).display().to_string());
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            break;
        }
    }
    Ok(removed)
}

/// Whether the absolute `path` names a regular file in the tree at `root` as a sandbox on it
/// would resolve it: every symlink, absolute ones too, stays inside the tree. A plain join
/// would follow a hostile tree's links through the host (and tell whoever built the tree
/// whether a host file exists) and count a dangling link as a file.
pub(crate) fn has_file(root: &Path, path: &str) -> bool {
    use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
    let flags = OFlags::PATH | OFlags::CLOEXEC;
    let Ok(dir) = rustix::fs::open(root, flags | OFlags::DIRECTORY, Mode::empty()) else {
        return false;
    };
    rustix::fs::openat2(
        &dir,
        path.trim_start_matches('/'),
        flags,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )
    .and_then(|fd| rustix::fs::fstat(&fd))
    .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
}

/// The directories every root has, the temporary ones sticky and world-writable.
pub(crate) fn make_dirs(root: &Path) -> io::Result<()> {
    for dir in ROOT_DIRS {
        std::fs::create_dir_all(root.join(dir))?;
    }
    for dir in ["tmp", "var/tmp"] {
        std::fs::set_permissions(root.join(dir), std::fs::Permissions::from_mode(0o1777))?;
    }
    Ok(())
}

/// The `host` image's /etc: the generated accounts (root, `user` = 1000, nobody, none with a
/// password) and the resolver files, replacing whatever `etc` held (a symlink there is
/// replaced, never followed). Every file is 0644, the shadow file too: the sandbox cannot map
/// the host's root who owns them, so its root could not read a 0640 one, and can write none of
/// them, so no hash ever lands there.
pub(crate) fn write_etc(etc: &Path) -> io::Result<()> {
    let shadow = shadow_of(PASSWD);
    let accounts = [("passwd", PASSWD), ("group", GROUP), ("shadow", &shadow)];
    for (name, content) in accounts.iter().chain(RESOLVER) {
        replace_file(&etc.join(name), content, 0o644)?;
    }
    Ok(())
}

/// Writes `content` as a new file at `path`, removing what was there first (a symlink is
/// removed, never written through).
fn replace_file(path: &Path, content: &str, mode: u32) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::write(path, content)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Makes a tree built from packages, an archive or a template step fit to be every sandbox's
/// read-only lower layer: secrets and package-manager state out, only directories, regular
/// files and symlinks left (device nodes, fifos and sockets are dropped: the agent builds /dev
/// itself), setuid and setgid bits cleared (a sandbox runs under no_new_privs anyway; a tree
/// that never has them cannot hand them to another runtime), the tree's accounts checked and
/// the generated ones added, the root directories and resolver files in place. Owners are
/// kept as the sandbox sees them (runtimes mount the tree id-mapped onto each sandbox's ids),
/// so a file an image or a step gave to `user` or `app` is theirs in every session; an owner
/// no sandbox has (an id of 65536 or more) becomes root. The tree's own root directory is
/// left to host root alone: its files belong to ids a host user may have, and no sandbox sees
/// that directory's mode (its root is an overlay whose upper layer gives `/` its own).
/// Returns the tree's size in bytes.
pub(crate) fn sanitize(root: &Path) -> io::Result<u64> {
    // Every path below is joined under `root` and resolved by the host as the daemon's root:
    // a tree a template step changed may have `etc -> /etc` (its layer replaced the directory
    // by a symlink), and writing the accounts there would write the host's.
    unlink_symlinked_dirs(root)?;
    for rel in REMOVED {
        remove_any(&root.join(rel))?;
    }
    for dir in ["dev", "proc", "sys", "tmp", "var/tmp", "run"] {
        empty_dir(&root.join(dir))?;
    }
    make_dirs(root)?;
    std::fs::create_dir_all(root.join("var/log"))?;
    let etc = root.join("etc");
    accounts::merge(&etc)?;
    for (name, content) in RESOLVER {
        replace_file(&etc.join(name), content, 0o644)?;
    }
    let mut size = 0;
    walk(root, &mut size)?;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(TREE_ROOT_MODE))?;
    Ok(size)
}

/// The mode of a stored tree's root directory: see [`sanitize`].
pub(crate) const TREE_ROOT_MODE: u32 = 0o700;

/// An owner a sandbox has, or root.
fn sandbox_id(id: u32) -> u32 {
    if id < SANDBOX_IDS {
        id
    } else {
        0
    }
}

fn walk(path: &Path, size: &mut u64) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    let ft = meta.file_type();
    if !(ft.is_dir() || ft.is_file() || ft.is_symlink()) {
        return std::fs::remove_file(path);
    }
    let (uid, gid) = (sandbox_id(meta.uid()), sandbox_id(meta.gid()));
    if (uid, gid) != (meta.uid(), meta.gid()) {
        lchown(path, Some(uid), Some(gid))?;
    }
    if !ft.is_symlink() {
        let mode = meta.mode() & 0o7777;
        if mode & 0o6000 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & !0o6000))?;
        }
    }
    *size += meta.len();
    if ft.is_dir() {
        for entry in std::fs::read_dir(path)? {
            walk(&entry?.path(), size)?;
        }
    }
    Ok(())
}

fn remove_any(path: &Path) -> io::Result<()> {
    let result = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn empty_dir(dir: &Path) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        remove_any(&entry?.path())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn sanitize_strips_privilege_and_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::create_dir_all(root.join("etc/ssh")).unwrap();
        std::fs::create_dir_all(root.join("dev")).unwrap();
        std::fs::write(root.join("usr/bin/su"), b"elf").unwrap();
        std::fs::set_permissions(
            root.join("usr/bin/su"),
            std::fs::Permissions::from_mode(0o4755),
        )
        .unwrap();
        std::fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/bash\napp:x:1001:1001::/home/app:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(root.join("etc/shadow"), "root:!:19000:0:99999:7:::\n").unwrap();
        std::fs::write(root.join("etc/shadow-"), b"root:$6$hash").unwrap();
        std::fs::write(root.join("etc/gshadow"), b"root:*::").unwrap();
        std::fs::write(root.join("usr/app"), b"app's").unwrap();
        std::fs::write(root.join("usr/far"), b"no sandbox's").unwrap();
        lchown(root.join("usr/app"), Some(1001), Some(1001)).unwrap();
        lchown(root.join("usr/far"), Some(70_000), Some(1001)).unwrap();
        std::fs::write(root.join("etc/ssh/ssh_host_ed25519_key"), b"k").unwrap();
        std::fs::write(root.join("dev/null"), b"").unwrap();
        // A symlink out of the tree is kept as a link, never followed.
        symlink("/etc/passwd", root.join("etc/hostname")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("usr/fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let size = sanitize(root).unwrap();
        assert!(size > 0);
        let mode = std::fs::metadata(root.join("usr/bin/su")).unwrap().mode();
        assert_eq!(mode & 0o7777, 0o755, "setuid bit kept");
        // The tree's accounts kept, the generated ones added, each with a shadow line.
        assert_eq!(
            std::fs::read_to_string(root.join("etc/passwd")).unwrap(),
            "root:x:0:0:root:/root:/bin/bash\napp:x:1001:1001::/home/app:/bin/sh\n\
             user:x:1000:1000:user:/home/user:/bin/bash\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("etc/shadow")).unwrap(),
            "root:!:19000:0:99999:7:::\napp:*::0:99999:7:::\nuser:*::0:99999:7:::\n\
             nobody:*::0:99999:7:::\n"
        );
        let shadow = std::fs::metadata(root.join("etc/shadow")).unwrap().mode();
        assert_eq!(shadow & 0o777, accounts::SHADOW_MODE);
        // Owners as the sandbox sees them, or root for an id no sandbox has.
        let owner = |p: &str| {
            let m = std::fs::symlink_metadata(root.join(p)).unwrap();
            (m.uid(), m.gid())
        };
        assert_eq!(owner("usr/app"), (1001, 1001));
        assert_eq!(owner("usr/far"), (0, 1001));
        let top = std::fs::metadata(root).unwrap().mode();
        assert_eq!(top & 0o7777, TREE_ROOT_MODE, "host users reach the tree");
        for gone in [
            "etc/shadow-",
            "etc/gshadow",
            "etc/ssh",
            "dev/null",
            "usr/fifo",
        ] {
            assert!(
                std::fs::symlink_metadata(root.join(gone)).is_err(),
                "{gone} kept"
            );
        }
        assert_eq!(
            std::fs::read_to_string(root.join("etc/hostname")).unwrap(),
            "sandbox\n"
        );
        assert!(root.join("home/user").is_dir() && root.join("workspace").is_dir());
        let tmp = std::fs::metadata(root.join("tmp")).unwrap().mode();
        assert_eq!(tmp & 0o7777, 0o1777);
    }

    /// A tree whose `etc`, `dev` or `var/lib` a hostile step or archive made symlinks to host
    /// directories: sanitizing replaces the links by directories and leaves the host's alone.
    #[test]
    fn sanitize_never_follows_a_symlinked_directory_out_of_the_tree() {
        let host = tempfile::tempdir().unwrap();
        let canary = |dir: &str| {
            let d = host.path().join(dir);
            std::fs::create_dir_all(&d).unwrap();
            for f in ["passwd", "shadow", "machine-id", "keep"] {
                std::fs::write(d.join(f), "host's own\n").unwrap();
            }
            d
        };
        let tree = tempfile::tempdir().unwrap();
        let root = tree.path();
        symlink(canary("etc"), root.join("etc")).unwrap();
        symlink(canary("dev"), root.join("dev")).unwrap();
        std::fs::create_dir(root.join("var")).unwrap();
        symlink(canary("lib"), root.join("var/lib")).unwrap();
        symlink(host.path().join("lib"), root.join("sys")).unwrap();
        sanitize(root).unwrap();
        for dir in ["etc", "dev", "lib"] {
            for f in ["passwd", "shadow", "machine-id", "keep"] {
                let path = host.path().join(dir).join(f);
                assert_eq!(
                    std::fs::read_to_string(&path).unwrap(),
                    "host's own\n",
                    "{} changed",
                    path.display()
                );
            }
        }
        for dir in ["etc", "dev", "var/lib", "sys"] {
            let link = std::fs::symlink_metadata(root.join(dir)).is_ok_and(|m| m.is_symlink());
            assert!(!link, "{dir} is still a symlink");
        }
        assert!(root.join("etc").is_dir() && root.join("dev").is_dir());
        let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
        assert!(passwd.starts_with("root:x:0:0:"), "{passwd}");
    }

    #[test]
    fn every_generated_account_has_a_shadow_line_without_a_password() {
        let shadow = shadow_of(PASSWD);
        let names = |file: &str| -> Vec<String> {
            file.lines()
                .map(|l| l.split(':').next().unwrap().to_string())
                .collect()
        };
        assert_eq!(names(PASSWD), names(&shadow));
        for line in shadow.lines() {
            let fields: Vec<&str> = line.split(':').collect();
            assert_eq!(fields.len(), 9, "{line}");
            assert_eq!(fields[1], "*", "{line}: an account with a password");
            assert_eq!(
                fields[2], "",
                "{line}: a date of last change (0 = change it now)"
            );
        }
    }
}
