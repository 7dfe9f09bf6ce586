//! Uploads: a hidden temporary file beside the destination, renamed over it on commit, with
//! the requested (or inherited) mode and owner, and the request's metadata (none kept from the
//! file it replaces).

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use koder_agent_protocol::metadata::check_metadata;
use koder_agent_protocol::{AgentError, Entry, ErrorCode, WriteFileRequest};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, StatxFlags};
use rustix::io::Errno;

use super::entry::{entry_at, file_type};
use super::error::{errno_err, io_err, is_a_directory, shown};
use super::owner::{check_owner, chown_fd};
use super::path::split_parent;
use super::{xattr, Fs};

/// Permission bits of a new file when the request names none.
const DEFAULT_FILE_MODE: u32 = 0o644;
/// Bits a request may set on a file: no setuid, no setgid.
const ALLOWED_FILE_MODE: u32 = 0o7777 & !0o6000;
/// Prefix of the hidden temporary files uploads are written to before the atomic rename.
const TEMP_PREFIX: &str = ".koder-upload-";

impl Fs {
    /// Starts an upload to `req.path`: the bytes go to a hidden temporary file in the
    /// destination's directory, which [`PendingWrite::commit`] renames over the destination.
    ///
    /// Mode: `req.mode` (without setuid/setgid) if given; otherwise the mode (and owner) of the
    /// regular file being replaced; otherwise 0644. Owner: that of the file being replaced;
    /// otherwise `req.owner` (also of the parent directories it creates); otherwise root.
    pub fn begin_write(&self, req: &WriteFileRequest) -> Result<PendingWrite, AgentError> {
        const OP: &str = "write";
        let abs = self.normalize(&req.path)?;
        check_owner(req.owner)?;
        check_metadata(&req.metadata).map_err(|e| {
            AgentError::new(
                ErrorCode::InvalidRequest,
                format!("{OP} {}: {e}", shown(&abs)),
            )
        })?;
        let Some((parent, name)) = split_parent(&abs) else {
            return Err(AgentError::new(
                ErrorCode::IsADirectory,
                format!("{OP} {}: is the sandbox root directory", shown(&abs)),
            ));
        };
        if req.create_parents {
            self.make_dir_abs(OP, parent, req.owner)?;
        }
        let pfd = self.open_dir_path(OP, parent, &abs)?;
        let existing = match rfs::statx(
            &pfd,
            name,
            AtFlags::SYMLINK_NOFOLLOW,
            StatxFlags::BASIC_STATS,
        ) {
            Ok(st) => Some(st),
            Err(Errno::NOENT) => None,
            Err(e) => return Err(errno_err(OP, &abs, e)),
        };
        let replaced_file = match &existing {
            Some(st) if file_type(st) == FileType::Directory => {
                return Err(is_a_directory(OP, &abs));
            }
            Some(st) if file_type(st) == FileType::RegularFile => Some(st),
            _ => None,
        };
        let mode = match (req.mode, replaced_file) {
            (Some(mode), _) => mode & ALLOWED_FILE_MODE,
            (None, Some(st)) => u32::from(st.stx_mode) & ALLOWED_FILE_MODE,
            (None, None) => DEFAULT_FILE_MODE,
        };
        let (file, tmp) = create_temp(pfd.as_fd()).map_err(|e| errno_err(OP, &abs, e))?;
        // From here on, dropping `pending` removes the temporary file.
        let pending = PendingWrite {
            file,
            parent: pfd,
            tmp: Some(tmp),
            name: name.to_owned(),
            path: abs,
            written: 0,
            max_bytes: req.max_bytes,
        };
        match (replaced_file, req.owner) {
            (Some(st), _) => {
                // Best effort: keep the replaced file's owner, so a sandbox user keeps its file.
                let _ =
                    std::os::unix::fs::fchown(&pending.file, Some(st.stx_uid), Some(st.stx_gid));
            }
            // Before the rename: the file never appears with another owner.
            (None, Some(owner)) => chown_fd(pending.file.as_fd(), owner)
                .map_err(|e| errno_err(OP, &pending.path, e))?,
            (None, None) => {}
        }
        // Set the mode explicitly: the umask must not change what was asked for.
        rfs::fchmod(&pending.file, Mode::from_raw_mode(mode))
            .map_err(|e| errno_err(OP, &pending.path, e))?;
        // On the temporary file: the destination appears with its metadata or not at all.
        xattr::write(&pending.file, &req.metadata).map_err(|e| errno_err(OP, &pending.path, e))?;
        Ok(pending)
    }
}

/// An upload in progress: bytes go to a hidden temporary file next to the destination, which
/// [`commit`](PendingWrite::commit) renames over it. Dropped without commit, nothing is left.
#[derive(Debug)]
pub struct PendingWrite {
    file: File,
    /// `O_PATH` descriptor of the destination's directory.
    parent: OwnedFd,
    /// Name of the temporary file in `parent`; `None` once it was discarded or committed.
    tmp: Option<String>,
    /// Final name of the destination in `parent`.
    name: String,
    /// Normalised in-sandbox path of the destination, for entries and messages.
    path: String,
    written: u64,
    max_bytes: Option<u64>,
}

impl PendingWrite {
    /// Appends bytes. More than `max_bytes` in total → `TooLarge`; a full disk → `NoSpace`.
    /// After any error the upload is discarded (its temporary file removed) and every later
    /// call fails.
    pub fn write(&mut self, data: &[u8]) -> Result<(), AgentError> {
        if self.tmp.is_none() {
            return Err(self.aborted());
        }
        let total = self
            .written
            .saturating_add(u64::try_from(data.len()).unwrap_or(u64::MAX));
        if let Some(max) = self.max_bytes {
            if total > max {
                self.discard();
                return Err(AgentError::new(
                    ErrorCode::TooLarge,
                    format!("write {}: more than {max} bytes", shown(&self.path)),
                ));
            }
        }
        if let Err(e) = self.file.write_all(data) {
            self.discard();
            return Err(io_err("write", &self.path, &e));
        }
        self.written = total;
        Ok(())
    }

    /// Atomically replaces the destination with what was written: renames the temporary file
    /// over it. An existing symlink at the destination is replaced itself, never followed; a
    /// directory at the destination → `IsADirectory`.
    pub fn commit(mut self) -> Result<Entry, AgentError> {
        const OP: &str = "write";
        let Some(tmp) = self.tmp.clone() else {
            return Err(self.aborted());
        };
        match rfs::statx(
            &self.parent,
            self.name.as_str(),
            AtFlags::SYMLINK_NOFOLLOW,
            StatxFlags::TYPE,
        ) {
            Ok(st) if file_type(&st) == FileType::Directory => {
                return Err(is_a_directory(OP, &self.path));
            }
            _ => {}
        }
        rfs::renameat(&self.parent, tmp.as_str(), &self.parent, self.name.as_str())
            .map_err(|e| errno_err(OP, &self.path, e))?;
        // The temporary name is gone: the file now is the destination.
        self.tmp = None;
        entry_at(
            self.parent.as_fd(),
            self.name.as_str(),
            self.name.as_str(),
            self.path.clone(),
        )
        .map_err(|e| errno_err(OP, &self.path, e))
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    fn discard(&mut self) {
        if let Some(tmp) = self.tmp.take() {
            let _ = rfs::unlinkat(&self.parent, tmp.as_str(), AtFlags::empty());
        }
    }

    fn aborted(&self) -> AgentError {
        AgentError::new(
            ErrorCode::InvalidRequest,
            format!("write {}: the upload was aborted", shown(&self.path)),
        )
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        self.discard();
    }
}

/// Creates a uniquely named hidden temporary file (mode 0600 until the caller sets the final
/// mode) in `parent`.
fn create_temp(parent: BorrowedFd<'_>) -> Result<(File, String), Errno> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut last = Errno::EXIST;
    for _ in 0..16 {
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!("{TEMP_PREFIX}{}-{seq}-{nanos:08x}", std::process::id());
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rfs::openat(parent, name.as_str(), flags, Mode::from_raw_mode(0o600)) {
            Ok(fd) => return Ok((File::from(fd), name)),
            Err(e @ Errno::EXIST) => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{symlink, PermissionsExt};

    use koder_agent_protocol::{EntryKind, ErrorCode};

    use super::super::testenv::{code, mode_of, req, Env};

    #[test]
    fn write_replaces_atomically() {
        let env = Env::new();
        std::fs::write(env.p("/workspace/f.txt"), b"old").unwrap();
        let mut w = env.fs.begin_write(&req("/workspace/f.txt")).unwrap();
        w.write(b"new ").unwrap();
        w.write(b"content").unwrap();
        assert_eq!(w.written(), 11);
        // Not visible before commit.
        assert_eq!(std::fs::read(env.p("/workspace/f.txt")).unwrap(), b"old");
        let e = w.commit().unwrap();
        assert_eq!(
            std::fs::read(env.p("/workspace/f.txt")).unwrap(),
            b"new content"
        );
        assert_eq!(e.path, "/workspace/f.txt");
        assert_eq!(e.name, "f.txt");
        assert_eq!(e.kind, EntryKind::File);
        assert_eq!(e.size, 11);
        assert!(e.modified_ms > 1_600_000_000_000);
        assert_eq!(env.names("/workspace"), ["f.txt"]);
        // Relative paths land in the default directory.
        let e = env.write("rel/../rel.txt", b"r").unwrap();
        assert_eq!(e.path, "/workspace/rel.txt");
        assert_eq!(std::fs::read(env.p("/workspace/rel.txt")).unwrap(), b"r");
    }

    #[test]
    fn write_through_symlink_replaces_the_link() {
        let env = Env::new();
        symlink(env.host_secret(), env.p("/workspace/hostlink")).unwrap();
        let e = env.write("/workspace/hostlink", b"mine").unwrap();
        assert_eq!(e.kind, EntryKind::File);
        assert!(std::fs::symlink_metadata(env.p("/workspace/hostlink"))
            .unwrap()
            .is_file());
        assert_eq!(
            std::fs::read(env.p("/workspace/hostlink")).unwrap(),
            b"mine"
        );
        env.assert_host_intact();
        // Same for a link to a file inside the root: the target is untouched.
        std::fs::write(env.p("/workspace/target"), b"target").unwrap();
        symlink("target", env.p("/workspace/inlink")).unwrap();
        env.write("/workspace/inlink", b"replaced").unwrap();
        assert_eq!(
            std::fs::read(env.p("/workspace/target")).unwrap(),
            b"target"
        );
        assert_eq!(
            std::fs::read(env.p("/workspace/inlink")).unwrap(),
            b"replaced"
        );
    }

    #[test]
    fn write_under_symlinked_parent_stays_in_root() {
        let env = Env::new();
        symlink(env.host.path(), env.p("/hd")).unwrap();
        assert_eq!(code(env.write("/hd/new", b"x")), ErrorCode::NotFound);
        assert_eq!(code(env.write("/hd/secret", b"x")), ErrorCode::NotFound);
        let mut r = req("/hd/new");
        r.create_parents = true;
        // The link dangles inside the root: mkdir -p refuses it.
        assert_eq!(code(env.fs.begin_write(&r)), ErrorCode::AlreadyExists);
        r.path = "/hd/sub/new".to_owned();
        assert_eq!(code(env.fs.begin_write(&r)), ErrorCode::AlreadyExists);
        // Once the link's target exists inside the root, writes land there.
        std::fs::create_dir_all(env.p(&env.host.path().to_string_lossy())).unwrap();
        r.path = "/hd/new".to_owned();
        let mut w = env.fs.begin_write(&r).unwrap();
        w.write(b"inside").unwrap();
        let e = w.commit().unwrap();
        assert_eq!(e.path, "/hd/new");
        assert!(!env.host.path().join("new").exists());
        let inside = env.p(&format!("{}/new", env.host.path().display()));
        assert_eq!(std::fs::read(inside).unwrap(), b"inside");
        env.assert_host_intact();
    }

    #[test]
    fn write_over_limit_is_too_large_and_leaves_nothing() {
        let env = Env::new();
        let mut r = req("/workspace/big");
        r.max_bytes = Some(10);
        let mut w = env.fs.begin_write(&r).unwrap();
        w.write(b"123456").unwrap();
        assert_eq!(code(w.write(b"789012")), ErrorCode::TooLarge);
        // Discarded right away, not only on drop.
        assert!(env.names("/workspace").is_empty());
        assert_eq!(code(w.write(b"x")), ErrorCode::InvalidRequest);
        assert_eq!(code(w.commit()), ErrorCode::InvalidRequest);
        assert!(env.names("/workspace").is_empty());
        // Exactly the limit is fine.
        let mut w = env.fs.begin_write(&r).unwrap();
        w.write(b"1234567890").unwrap();
        assert_eq!(w.commit().unwrap().size, 10);
    }

    #[test]
    fn drop_without_commit_leaves_nothing() {
        let env = Env::new();
        std::fs::write(env.p("/workspace/keep"), b"keep").unwrap();
        {
            let mut w = env.fs.begin_write(&req("/workspace/keep")).unwrap();
            w.write(b"discarded").unwrap();
            assert_eq!(
                env.names("/workspace").len(),
                2,
                "temp file exists meanwhile"
            );
            let mut w2 = env.fs.begin_write(&req("/workspace/new")).unwrap();
            w2.write(b"discarded").unwrap();
        }
        assert_eq!(env.names("/workspace"), ["keep"]);
        assert_eq!(std::fs::read(env.p("/workspace/keep")).unwrap(), b"keep");
    }

    #[test]
    fn write_modes() {
        let env = Env::new();
        env.write("/workspace/default", b"").unwrap();
        assert_eq!(mode_of(&env.p("/workspace/default")), 0o644);
        let mut r = req("/workspace/suid");
        r.mode = Some(0o106755);
        let mut w = env.fs.begin_write(&r).unwrap();
        w.write(b"#!/bin/sh\n").unwrap();
        let e = w.commit().unwrap();
        assert_eq!(e.mode, 0o755);
        assert_eq!(mode_of(&env.p("/workspace/suid")), 0o755);
        // Replacing a file without a mode keeps its permission bits.
        std::fs::set_permissions(
            env.p("/workspace/suid"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        env.write("/workspace/suid", b"again").unwrap();
        assert_eq!(mode_of(&env.p("/workspace/suid")), 0o700);
    }

    #[test]
    fn write_onto_directory_is_refused() {
        let env = Env::new();
        std::fs::create_dir(env.p("/workspace/d")).unwrap();
        assert_eq!(
            code(env.fs.begin_write(&req("/workspace/d"))),
            ErrorCode::IsADirectory
        );
        assert_eq!(code(env.fs.begin_write(&req("/"))), ErrorCode::IsADirectory);
        assert_eq!(
            code(env.fs.begin_write(&req("/workspace/.."))),
            ErrorCode::IsADirectory
        );
        // A directory appearing before commit.
        let mut w = env.fs.begin_write(&req("/workspace/late")).unwrap();
        w.write(b"x").unwrap();
        std::fs::create_dir(env.p("/workspace/late")).unwrap();
        assert_eq!(code(w.commit()), ErrorCode::IsADirectory);
        assert_eq!(env.names("/workspace"), ["d", "late"]);
        // Missing parent without create_parents.
        assert_eq!(
            code(env.fs.begin_write(&req("/workspace/no/f"))),
            ErrorCode::NotFound
        );
        std::fs::write(env.p("/workspace/file"), b"").unwrap();
        assert_eq!(
            code(env.fs.begin_write(&req("/workspace/file/f"))),
            ErrorCode::NotADirectory
        );
    }
}
