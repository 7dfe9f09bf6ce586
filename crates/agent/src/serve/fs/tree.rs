//! Changing the tree: `mkdir -p`, removal (recursive without following symlinks), moves.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use koder_agent_protocol::{AgentError, Entry, ErrorCode};
use rustix::fs::{self as rfs, AtFlags, Dir, FileType, Mode, OFlags, StatxFlags};
use rustix::io::Errno;

use super::entry::{entry_at, file_type};
use super::error::{code_of, describe, errno_err, invalid, not_a_dir_in_the_way, shown};
use super::owner::{check_owner, chown_fd};
use super::path::split_parent;
use super::Fs;

/// Permission bits of directories created by `make_dir` / `create_parents`.
const DIR_MODE: u32 = 0o755;
/// How many passes `remove(recursive)` makes over a directory that keeps getting new entries.
const REMOVE_PASSES: usize = 3;

impl Fs {
    /// `mkdir -p`: creates missing directories (mode 0755), succeeds when `path` already is a
    /// directory (or a symlink to one), `AlreadyExists` when a non-directory is in the way of the
    /// last component, `NotADirectory` when it is in the way of an earlier one. The directories
    /// it creates belong to `owner` if given.
    pub fn make_dir(&self, path: &str, owner: Option<(u32, u32)>) -> Result<Entry, AgentError> {
        let abs = self.normalize(path)?;
        check_owner(owner)?;
        self.make_dir_abs("mkdir", &abs, owner)?;
        self.lstat_abs("mkdir", &abs)
    }

    /// Removes a file or symlink (the link itself), an empty directory, or with `recursive` a
    /// whole tree without following any symlink in it. The root itself is refused.
    pub fn remove(&self, path: &str, recursive: bool) -> Result<(), AgentError> {
        const OP: &str = "remove";
        let abs = self.normalize(path)?;
        let (parent, name) = split_parent(&abs)
            .ok_or_else(|| invalid(OP, &abs, "refusing to remove the sandbox root"))?;
        let pfd = self.open_dir_path(OP, parent, &abs)?;
        let st = rfs::statx(&pfd, name, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::TYPE)
            .map_err(|e| errno_err(OP, &abs, e))?;
        let result = if file_type(&st) == FileType::Directory {
            if recursive {
                remove_tree(pfd.as_fd(), name)
            } else {
                rfs::unlinkat(&pfd, name, AtFlags::REMOVEDIR)
            }
        } else {
            rfs::unlinkat(&pfd, name, AtFlags::empty())
        };
        result.map_err(|e| errno_err(OP, &abs, e))
    }

    /// Moves `from` to `to` (replacing a file at `to`, as rename(2) does) and returns the entry
    /// of the destination. Moving across mounts is refused (`Io`); the root cannot be moved.
    pub fn rename(&self, from: &str, to: &str) -> Result<Entry, AgentError> {
        const OP: &str = "move";
        let src = self.normalize(from)?;
        let dst = self.normalize(to)?;
        let (src_parent, src_name) = split_parent(&src)
            .ok_or_else(|| invalid(OP, &src, "refusing to move the sandbox root"))?;
        let (dst_parent, dst_name) = split_parent(&dst)
            .ok_or_else(|| invalid(OP, &dst, "refusing to replace the sandbox root"))?;
        let src_fd = self.open_dir_path(OP, src_parent, &src)?;
        let dst_fd = self.open_dir_path(OP, dst_parent, &dst)?;
        rfs::renameat(&src_fd, src_name, &dst_fd, dst_name).map_err(|e| {
            let what = format!("{} -> {}", shown(&src), shown(&dst));
            if e == Errno::XDEV {
                AgentError::new(
                    ErrorCode::Io,
                    format!("{OP} {what}: cannot move across mount points"),
                )
            } else {
                AgentError::new(code_of(e), format!("{OP} {what}: {}", describe(e)))
            }
        })?;
        entry_at(dst_fd.as_fd(), dst_name, dst_name, dst.clone())
            .map_err(|e| errno_err(OP, &dst, e))
    }

    /// `mkdir -p` of a normalised absolute path; what it creates belongs to `owner` if given.
    pub(super) fn make_dir_abs(
        &self,
        op: &str,
        abs: &str,
        owner: Option<(u32, u32)>,
    ) -> Result<(), AgentError> {
        let components: Vec<&str> = abs.split('/').filter(|c| !c.is_empty()).collect();
        let mut parent: Option<OwnedFd> = None;
        let mut prefix = String::with_capacity(abs.len());
        for (i, component) in components.iter().enumerate() {
            let last = i + 1 == components.len();
            prefix.push('/');
            prefix.push_str(component);
            match self.open_in_root(&prefix, OFlags::PATH | OFlags::DIRECTORY) {
                Ok(fd) => {
                    parent = Some(fd);
                    continue;
                }
                Err(Errno::NOENT) => {}
                Err(Errno::NOTDIR) => return Err(not_a_dir_in_the_way(op, &prefix, last)),
                Err(e) => return Err(errno_err(op, &prefix, e)),
            }
            let pfd = parent.as_ref().map_or(self.root_fd(), |fd| fd.as_fd());
            let created = match rfs::mkdirat(pfd, *component, Mode::from_raw_mode(DIR_MODE)) {
                Ok(()) => true,
                Err(Errno::EXIST) => false,
                Err(e) => return Err(errno_err(op, &prefix, e)),
            };
            let flags = if created {
                OFlags::RDONLY | OFlags::DIRECTORY
            } else {
                OFlags::PATH | OFlags::DIRECTORY
            };
            match self.open_in_root(&prefix, flags) {
                Ok(fd) => {
                    if created {
                        // The umask must not change the mode; best effort.
                        let _ = rfs::fchmod(&fd, Mode::from_raw_mode(DIR_MODE));
                        if let Some(owner) = owner {
                            chown_fd(fd.as_fd(), owner).map_err(|e| errno_err(op, &prefix, e))?;
                        }
                    }
                    parent = Some(fd);
                }
                Err(Errno::NOTDIR) => return Err(not_a_dir_in_the_way(op, &prefix, last)),
                // A dangling symlink is in the way (`mkdir -p` says "File exists" too).
                Err(Errno::NOENT) => return Err(not_a_dir_in_the_way(op, &prefix, true)),
                Err(e) => return Err(errno_err(op, &prefix, e)),
            }
        }
        Ok(())
    }
}

/// Removes the directory `name` in `parent` and everything in it, never following symlinks.
fn remove_tree(parent: BorrowedFd<'_>, name: &str) -> Result<(), Errno> {
    remove_tree_c(parent, &CString::new(name).map_err(|_| Errno::INVAL)?)
}

fn remove_tree_c(parent: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    for _ in 0..REMOVE_PASSES {
        let flags = OFlags::RDONLY
            | OFlags::DIRECTORY
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::CLOEXEC;
        let fd = match rfs::openat(parent, name, flags, Mode::empty()) {
            Ok(fd) => fd,
            // Swapped for a symlink or a file since it was inspected: remove that instead.
            Err(Errno::LOOP | Errno::NOTDIR) => {
                return rfs::unlinkat(parent, name, AtFlags::empty());
            }
            Err(e) => return Err(e),
        };
        clear_dir(fd)?;
        match rfs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            // Something was created in it concurrently: another pass.
            Err(Errno::NOTEMPTY) => continue,
            result => return result,
        }
    }
    Err(Errno::NOTEMPTY)
}

/// Removes everything inside the directory `fd`.
fn clear_dir(fd: OwnedFd) -> Result<(), Errno> {
    let mut dir = Dir::new(fd)?;
    while let Some(item) = dir.read() {
        let item = item?;
        let name = item.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let dfd = dir.fd()?;
        let is_dir = match item.file_type() {
            FileType::Directory => true,
            FileType::Unknown => {
                match rfs::statx(dfd, name, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::TYPE) {
                    Ok(st) => file_type(&st) == FileType::Directory,
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(e),
                }
            }
            _ => false,
        };
        let result = if is_dir {
            remove_tree_c(dfd, name)
        } else {
            match rfs::unlinkat(dfd, name, AtFlags::empty()) {
                // Replaced by a directory meanwhile.
                Err(Errno::ISDIR) => remove_tree_c(dfd, name),
                result => result,
            }
        };
        match result {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use koder_agent_protocol::{EntryKind, ErrorCode};

    use super::super::testenv::{code, mode_of, Env};

    #[test]
    fn make_dir_behaves_like_mkdir_p() {
        let env = Env::new();
        let e = env.fs.make_dir("/workspace/a/b/c", None).unwrap();
        assert_eq!(e.kind, EntryKind::Dir);
        assert_eq!(e.path, "/workspace/a/b/c");
        assert_eq!(e.mode, 0o755);
        assert!(env.p("/workspace/a/b/c").is_dir());
        assert_eq!(mode_of(&env.p("/workspace/a")), 0o755);
        // Existing directory: fine.
        env.fs.make_dir("/workspace/a/b", None).unwrap();
        env.fs.make_dir("rel/dir", None).unwrap();
        assert!(env.p("/workspace/rel/dir").is_dir());
        env.fs.make_dir("/", None).unwrap();
        std::fs::write(env.p("/workspace/f"), b"").unwrap();
        assert_eq!(
            code(env.fs.make_dir("/workspace/f", None)),
            ErrorCode::AlreadyExists
        );
        assert_eq!(
            code(env.fs.make_dir("/workspace/f/g", None)),
            ErrorCode::NotADirectory
        );
        symlink("/nowhere", env.p("/workspace/dangling")).unwrap();
        assert_eq!(
            code(env.fs.make_dir("/workspace/dangling", None)),
            ErrorCode::AlreadyExists
        );
        // Through a symlink to a host directory: dangling inside the root, so in the way.
        symlink(env.host.path(), env.p("/hd")).unwrap();
        assert_eq!(
            code(env.fs.make_dir("/hd/sub/dir", None)),
            ErrorCode::AlreadyExists
        );
        assert!(!env.host.path().join("sub").exists());
        // Once the link's target exists inside the root, it is followed there.
        std::fs::create_dir_all(env.p(&env.host.path().to_string_lossy())).unwrap();
        env.fs.make_dir("/hd/sub/dir", None).unwrap();
        assert!(!env.host.path().join("sub").exists());
        assert!(env
            .p(&format!("{}/sub/dir", env.host.path().display()))
            .is_dir());
        // Through a symlink to an in-root directory: follows it.
        symlink("/workspace/a", env.p("/alink")).unwrap();
        env.fs.make_dir("/alink/z", None).unwrap();
        assert!(env.p("/workspace/a/z").is_dir());
        env.assert_host_intact();
    }

    #[test]
    fn remove_files_links_and_dirs() {
        let env = Env::new();
        std::fs::write(env.p("/workspace/f"), b"").unwrap();
        env.fs.remove("/workspace/f", false).unwrap();
        assert!(!env.p("/workspace/f").exists());
        assert_eq!(
            code(env.fs.remove("/workspace/f", false)),
            ErrorCode::NotFound
        );
        // A symlink is removed, not its target.
        symlink(env.host_secret(), env.p("/workspace/l")).unwrap();
        env.fs.remove("/workspace/l", true).unwrap();
        assert!(std::fs::symlink_metadata(env.p("/workspace/l")).is_err());
        symlink("/workspace", env.p("/wl")).unwrap();
        env.fs.remove("/wl", true).unwrap();
        assert!(env.p("/workspace").is_dir());
        // Directories.
        std::fs::create_dir_all(env.p("/workspace/d/e")).unwrap();
        std::fs::write(env.p("/workspace/d/e/f"), b"").unwrap();
        assert_eq!(
            code(env.fs.remove("/workspace/d", false)),
            ErrorCode::DirectoryNotEmpty
        );
        env.fs.remove("/workspace/d/e/f", false).unwrap();
        env.fs.remove("/workspace/d/e", false).unwrap();
        env.fs.remove("d", false).unwrap();
        assert!(env.names("/workspace").is_empty());
        // Never the root.
        for root in ["/", "/..", "/workspace/../..", "..", "/./"] {
            assert_eq!(
                code(env.fs.remove(root, true)),
                ErrorCode::InvalidPath,
                "{root}"
            );
        }
        assert!(env.p("/etc/passwd").exists());
        env.assert_host_intact();
    }

    #[test]
    fn remove_recursive_does_not_follow_symlinks() {
        let env = Env::new();
        std::fs::create_dir_all(env.p("/workspace/tree/sub/deeper")).unwrap();
        std::fs::write(env.p("/workspace/tree/sub/deeper/f"), b"").unwrap();
        std::fs::write(env.p("/workspace/tree/g"), b"").unwrap();
        std::fs::create_dir(env.p("/outside")).unwrap();
        std::fs::write(env.p("/outside/keep"), b"keep").unwrap();
        symlink(
            env.host.path().join("dir"),
            env.p("/workspace/tree/hostdir"),
        )
        .unwrap();
        symlink(env.host_secret(), env.p("/workspace/tree/sub/secret")).unwrap();
        symlink("../../outside", env.p("/workspace/tree/sub/rel")).unwrap();
        symlink("/outside", env.p("/workspace/tree/abs")).unwrap();
        env.fs.remove("/workspace/tree", true).unwrap();
        assert!(env.names("/workspace").is_empty());
        assert_eq!(std::fs::read(env.p("/outside/keep")).unwrap(), b"keep");
        env.assert_host_intact();
    }

    #[test]
    fn rename_moves_and_replaces() {
        let env = Env::new();
        std::fs::write(env.p("/workspace/a"), b"a").unwrap();
        std::fs::write(env.p("/workspace/b"), b"b").unwrap();
        let e = env.fs.rename("/workspace/a", "b").unwrap();
        assert_eq!(e.path, "/workspace/b");
        assert_eq!(e.size, 1);
        assert_eq!(std::fs::read(env.p("/workspace/b")).unwrap(), b"a");
        assert!(!env.p("/workspace/a").exists());
        assert_eq!(
            code(env.fs.rename("/workspace/a", "/workspace/c")),
            ErrorCode::NotFound
        );
        assert_eq!(
            code(env.fs.rename("/workspace/b", "/no/c")),
            ErrorCode::NotFound
        );
        // Directories move too; a file over a directory is refused.
        std::fs::create_dir(env.p("/workspace/d")).unwrap();
        assert_eq!(
            code(env.fs.rename("/workspace/b", "/workspace/d")),
            ErrorCode::IsADirectory
        );
        let e = env.fs.rename("/workspace/d", "/moved").unwrap();
        assert_eq!(e.kind, EntryKind::Dir);
        // A directory into itself.
        assert_eq!(
            code(env.fs.rename("/moved", "/moved/inner")),
            ErrorCode::InvalidPath
        );
        // The root is neither source nor destination.
        assert_eq!(code(env.fs.rename("/", "/x")), ErrorCode::InvalidPath);
        assert_eq!(code(env.fs.rename("/moved", "/..")), ErrorCode::InvalidPath);
        // Through a symlinked parent pointing at the host: stays inside the root.
        symlink(env.host.path(), env.p("/hd")).unwrap();
        assert_eq!(
            code(env.fs.rename("/workspace/b", "/hd/b")),
            ErrorCode::NotFound
        );
        assert_eq!(
            code(env.fs.rename("/hd/secret", "/stolen")),
            ErrorCode::NotFound
        );
        env.assert_host_intact();
    }
}
