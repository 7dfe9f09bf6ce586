//! The root descriptor and how request paths are resolved against it: lexical normalisation,
//! then `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` so nothing escapes the root.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use koder_agent_protocol::{AgentError, Entry};
use rustix::fs::{self as rfs, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::entry::{entry_at, entry_of_fd};
use super::error::{errno_err, invalid};
use super::path::{check_raw, lexical_normalize, relative, split_parent};

/// How every request path is resolved against the root descriptor.
const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);
/// `openat2` with `RESOLVE_IN_ROOT` answers `EAGAIN` when a concurrent rename or mount might have
/// let a `..` escape; it is safe to simply try again.
const OPENAT2_RETRIES: usize = 64;

/// File operations confined to one root directory.
pub struct Fs {
    /// `O_PATH | O_DIRECTORY` descriptor of the directory that acts as `/`.
    root: OwnedFd,
    /// Normalised absolute in-sandbox directory relative request paths are joined to.
    default_dir: String,
}

impl std::fmt::Debug for Fs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fs")
            .field("default_dir", &self.default_dir)
            .finish_non_exhaustive()
    }
}

impl Fs {
    /// `root` is the directory that acts as "/"; relative request paths resolve against
    /// `default_dir` (e.g. "/workspace", itself interpreted inside root).
    ///
    /// Fails when `root` cannot be opened as a directory, `default_dir` is not a valid path, or
    /// the kernel lacks `openat2` (Linux < 5.6, or a seccomp filter refusing it).
    pub fn new(root: &Path, default_dir: &str) -> std::io::Result<Self> {
        let root = rfs::openat(
            rfs::CWD,
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        if let Err(why) = check_raw(default_dir) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("default directory: {why}"),
            ));
        }
        let fs = Fs {
            root,
            default_dir: lexical_normalize(default_dir),
        };
        // Probe openat2 once so a kernel without it fails here, not on every request.
        fs.open_in_root("/", OFlags::PATH | OFlags::DIRECTORY)?;
        Ok(fs)
    }

    /// The directory descriptor that acts as `/`.
    pub(super) fn root_fd(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Validates a request path and turns it into a normalised absolute in-sandbox path.
    pub(super) fn normalize(&self, path: &str) -> Result<String, AgentError> {
        check_raw(path).map_err(|why| invalid("path", path, why))?;
        if path.starts_with('/') {
            Ok(lexical_normalize(path))
        } else {
            Ok(lexical_normalize(&format!("{}/{}", self.default_dir, path)))
        }
    }

    /// `openat2` of a normalised absolute path, inside the root, no magic links.
    pub(super) fn open_in_root(&self, abs: &str, flags: OFlags) -> Result<OwnedFd, Errno> {
        let rel = relative(abs);
        let mut tries = 0;
        loop {
            match rfs::openat2(
                &self.root,
                rel,
                flags | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE,
            ) {
                Err(Errno::AGAIN | Errno::INTR) if tries < OPENAT2_RETRIES => tries += 1,
                result => return result,
            }
        }
    }

    /// `O_PATH` descriptor of the directory `dir`; errors name `full`, the request's path.
    pub(super) fn open_dir_path(
        &self,
        op: &str,
        dir: &str,
        full: &str,
    ) -> Result<OwnedFd, AgentError> {
        self.open_in_root(dir, OFlags::PATH | OFlags::DIRECTORY)
            .map_err(|e| errno_err(op, full, e))
    }

    /// lstat-style entry of a normalised absolute path.
    pub(super) fn lstat_abs(&self, op: &str, abs: &str) -> Result<Entry, AgentError> {
        match split_parent(abs) {
            None => entry_of_fd(self.root.as_fd(), "/".to_owned(), abs.to_owned())
                .map_err(|e| errno_err(op, abs, e)),
            Some((parent, name)) => {
                let pfd = self.open_dir_path(op, parent, abs)?;
                entry_at(pfd.as_fd(), name, name, abs.to_owned()).map_err(|e| errno_err(op, abs, e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::path::Path;

    use koder_agent_protocol::{EntryKind, ErrorCode, MAX_PATH_BYTES};

    use super::super::testenv::{code, req, Env, SANDBOX_PASSWD};
    use super::Fs;

    #[test]
    fn invalid_paths_rejected() {
        let env = Env::new();
        assert_eq!(code(env.fs.stat("")), ErrorCode::InvalidPath);
        assert_eq!(code(env.fs.stat("/etc\0/passwd")), ErrorCode::InvalidPath);
        assert_eq!(
            code(env.fs.begin_write(&req("/a\0b"))),
            ErrorCode::InvalidPath
        );
        let long = format!("/{}", "a/".repeat(MAX_PATH_BYTES / 2 + 1));
        assert!(long.len() > MAX_PATH_BYTES);
        assert_eq!(code(env.fs.stat(&long)), ErrorCode::InvalidPath);
        assert_eq!(code(env.fs.open_read(&long, None)), ErrorCode::InvalidPath);
        assert_eq!(code(env.fs.make_dir(&long, None)), ErrorCode::InvalidPath);
        // One component longer than NAME_MAX.
        let long_name = format!("/workspace/{}", "x".repeat(300));
        assert_eq!(code(env.fs.stat(&long_name)), ErrorCode::InvalidPath);
        assert_eq!(code(env.write(&long_name, b"x")), ErrorCode::InvalidPath);
        // Messages carry the request path, never the host root.
        let err = env.fs.stat("/nope/x").unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
        assert!(err.message.contains("/nope/x"), "{}", err.message);
        assert!(!err.message.contains(&*env.root.path().to_string_lossy()));
    }

    #[test]
    fn many_components_within_the_limit() {
        let env = Env::new();
        // ~4000 bytes of `..` still lands on the sandbox's /etc/passwd.
        let path = format!("/{}etc/passwd", "../".repeat(1300));
        assert!(path.len() <= MAX_PATH_BYTES);
        assert_eq!(env.read(&path).unwrap(), SANDBOX_PASSWD);
        let deep = format!("/{}", "d/".repeat(2000));
        assert_eq!(code(env.fs.stat(&deep)), ErrorCode::NotFound);
    }

    #[test]
    fn dotdot_chains_stay_in_root() {
        let env = Env::new();
        assert_eq!(env.read("/../../etc/passwd").unwrap(), SANDBOX_PASSWD);
        assert_eq!(
            env.read("../../../../../etc/passwd").unwrap(),
            SANDBOX_PASSWD
        );
        assert_eq!(
            env.read("/workspace/../../../etc/./passwd").unwrap(),
            SANDBOX_PASSWD
        );
        let e = env.fs.stat("/../../etc/passwd").unwrap();
        assert_eq!(e.path, "/etc/passwd");
        assert_eq!(e.kind, EntryKind::File);
        // The host secret through `..` is just a path inside the root.
        let via_dotdot = format!("/../../../..{}", env.host_secret().display());
        assert_eq!(code(env.read(&via_dotdot)), ErrorCode::NotFound);
    }

    #[test]
    fn absolute_symlinks_resolve_inside_root() {
        let env = Env::new();
        symlink("/etc", env.p("/link")).unwrap();
        assert_eq!(env.read("/link/passwd").unwrap(), SANDBOX_PASSWD);
        symlink(env.host.path(), env.p("/hostlink")).unwrap();
        symlink(env.host_secret(), env.p("/secretlink")).unwrap();
        assert_eq!(code(env.read("/hostlink/secret")), ErrorCode::NotFound);
        assert_eq!(code(env.read("/secretlink")), ErrorCode::NotFound);
        assert_eq!(code(env.fs.stat("/hostlink/secret")), ErrorCode::NotFound);
        assert_eq!(code(env.fs.list("/hostlink", 1)), ErrorCode::NotFound);
        let e = env.fs.stat("/secretlink").unwrap();
        assert_eq!(e.kind, EntryKind::Symlink);
        assert_eq!(
            e.symlink_target.as_deref(),
            Some(&*env.host_secret().to_string_lossy())
        );
        env.assert_host_intact();
    }

    #[test]
    fn relative_symlinks_cannot_escape() {
        let env = Env::new();
        let up = "../".repeat(40);
        let host_rel = env
            .host_secret()
            .to_string_lossy()
            .trim_start_matches('/')
            .to_owned();
        symlink(format!("{up}{host_rel}"), env.p("/workspace/esc")).unwrap();
        assert_eq!(code(env.read("/workspace/esc")), ErrorCode::NotFound);
        symlink(&up, env.p("/workspace/top")).unwrap();
        // `top` is the sandbox root: /etc/passwd is the sandbox's.
        assert_eq!(
            env.read("/workspace/top/etc/passwd").unwrap(),
            SANDBOX_PASSWD
        );
        let (entries, _) = env.fs.list("/workspace/top", 1).unwrap();
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["etc", "workspace"]);
        assert_eq!(entries[0].path, "/workspace/top/etc");
        env.assert_host_intact();
    }

    #[test]
    fn symlink_loops_are_invalid_paths() {
        let env = Env::new();
        symlink("loop2", env.p("/loop1")).unwrap();
        symlink("loop1", env.p("/loop2")).unwrap();
        symlink("self", env.p("/self")).unwrap();
        assert_eq!(code(env.read("/loop1")), ErrorCode::InvalidPath);
        assert_eq!(code(env.read("/self")), ErrorCode::InvalidPath);
        assert_eq!(code(env.fs.stat("/loop1/x")), ErrorCode::InvalidPath);
        assert_eq!(code(env.fs.list("/loop1", 1)), ErrorCode::InvalidPath);
        // The link itself can be inspected and removed.
        assert_eq!(env.fs.stat("/loop1").unwrap().kind, EntryKind::Symlink);
        env.fs.remove("/loop1", false).unwrap();
        assert!(!env.p("/loop1").exists() && std::fs::symlink_metadata(env.p("/loop2")).is_ok());
    }

    #[test]
    fn proc_links_inside_root_cannot_reach_host() {
        let env = Env::new();
        symlink(
            format!("/proc/self/root{}", env.host_secret().display()),
            env.p("/p"),
        )
        .unwrap();
        symlink("/proc/self/cwd", env.p("/cwd")).unwrap();
        symlink("/proc/self/fd", env.p("/fds")).unwrap();
        // The root has no /proc: these are plain missing paths inside it.
        assert_eq!(code(env.read("/p")), ErrorCode::NotFound);
        assert_eq!(code(env.read("/cwd/Cargo.toml")), ErrorCode::NotFound);
        assert_eq!(code(env.fs.list("/fds", 1)), ErrorCode::NotFound);
        let secret_via_proc = format!("/proc/self/root{}", env.host_secret().display());
        assert_eq!(code(env.read(&secret_via_proc)), ErrorCode::NotFound);
        env.assert_host_intact();
    }

    #[test]
    fn magic_links_refused_with_real_root() {
        if !Path::new("/proc/self/root").exists() {
            eprintln!("no /proc: skipped");
            return;
        }
        let fs = Fs::new(Path::new("/"), "/").unwrap();
        assert_eq!(
            code(fs.open_read("/proc/self/root/etc/hostname", None)),
            ErrorCode::InvalidPath
        );
        assert_eq!(code(fs.stat("/proc/self/root/etc")), ErrorCode::InvalidPath);
        assert_eq!(code(fs.list("/proc/self/cwd", 1)), ErrorCode::InvalidPath);
        assert_eq!(
            code(fs.open_read("/proc/self/cwd/Cargo.toml", None)),
            ErrorCode::InvalidPath
        );
        assert_eq!(
            code(fs.open_read("/proc/self/fd/0", None)),
            ErrorCode::InvalidPath
        );
        assert_eq!(
            code(fs.open_read("/proc/self/exe", None)),
            ErrorCode::InvalidPath
        );
        // A plain symlink pointing at a magic link is refused as well.
        let host = tempfile::tempdir().unwrap();
        symlink("/proc/self/root/etc", host.path().join("l")).unwrap();
        let via = format!("{}/l/hostname", host.path().display());
        assert_eq!(code(fs.open_read(&via, None)), ErrorCode::InvalidPath);
        // lstat of a magic link itself just describes it.
        assert_eq!(fs.stat("/proc/self/root").unwrap().kind, EntryKind::Symlink);
    }

    #[test]
    fn new_rejects_bad_roots() {
        let file = tempfile::NamedTempFile::new().unwrap();
        assert!(Fs::new(file.path(), "/").is_err());
        assert!(Fs::new(Path::new("/nonexistent-koder-root"), "/").is_err());
        let dir = tempfile::tempdir().unwrap();
        assert!(Fs::new(dir.path(), "").is_err());
        assert!(Fs::new(dir.path(), "/a\0b").is_err());
        // A relative default dir is taken from the root.
        let fs = Fs::new(dir.path(), "work/../space").unwrap();
        assert_eq!(fs.default_dir, "/space");
    }
}
