//! File operations resolved inside the sandbox root only.
//!
//! The agent serves the daemon's file requests (stat, list, mkdir, remove, move, read, write).
//! Even though the agent has already `pivot_root`ed into the sandbox, every path is resolved
//! relative to a root directory descriptor with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`:
//! absolute symlinks, `..` chains and relative symlinks are all clamped to the root, and `/proc`
//! magic links (`/proc/self/root`, `/proc/<pid>/cwd`, `/proc/self/fd/N`, ...) are refused.
//!
//! Path handling:
//! * a request path must be non-empty, free of NUL bytes and at most [`MAX_PATH_BYTES`] long;
//! * relative paths are joined to the default directory;
//! * the result is normalised lexically (`//` and `.` dropped, `..` pops the previous component,
//!   `..` at the root stays at the root), so `/workspace/x/..` is `/workspace`; that normalised
//!   absolute path is what [`Entry::path`] reports. Symlinks met while resolving are then followed
//!   by the kernel, inside the root.
//! * operations on the final component (lstat, unlink, rename, create) open the *parent* through
//!   `openat2` and act with `*at` calls on the plain last name, so a symlink as the final component
//!   is never followed by those operations. After normalisation the last component is always a
//!   plain name, or the path is the root itself: mutating the root (remove, rename, write) is
//!   refused (`InvalidPath`, or `IsADirectory` for a write).
//!
//! All operations are synchronous; the caller runs them on a blocking thread.

use std::collections::BinaryHeap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use koder_agent_protocol::{
    AgentError, Entry, EntryKind, ErrorCode, WriteFileRequest, MAX_LIST_ENTRIES, MAX_PATH_BYTES,
};
use rustix::fs::{
    self as rfs, AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Statx, StatxFlags,
};
use rustix::io::Errno;

/// How every request path is resolved against the root descriptor.
const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);
/// `openat2` with `RESOLVE_IN_ROOT` answers `EAGAIN` when a concurrent rename or mount might have
/// let a `..` escape; it is safe to simply try again.
const OPENAT2_RETRIES: usize = 64;
/// Deepest level `list` descends to, whatever depth is asked (bounds open descriptors and
/// recursion); deeper directories make the answer flagged truncated.
pub const MAX_LIST_DEPTH: u32 = 128;
/// Permission bits of a new file when the request names none.
const DEFAULT_FILE_MODE: u32 = 0o644;
/// Sandbox uids and gids that exist (the size of a sandbox's id map).
const MAPPED_IDS: u32 = 65536;
/// Permission bits of directories created by `make_dir` / `create_parents`.
const DIR_MODE: u32 = 0o755;
/// Bits a request may set on a file: no setuid, no setgid.
const ALLOWED_FILE_MODE: u32 = 0o7777 & !0o6000;
/// Prefix of the hidden temporary files uploads are written to before the atomic rename.
const TEMP_PREFIX: &str = ".koder-upload-";
/// How many passes `remove(recursive)` makes over a directory that keeps getting new entries.
const REMOVE_PASSES: usize = 3;

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

    /// Entry of `path`, with lstat semantics for the final component: a symlink reports kind
    /// `Symlink` and its target, it is not followed.
    pub fn stat(&self, path: &str) -> Result<Entry, AgentError> {
        let abs = self.normalize(path)?;
        self.lstat_abs("stat", &abs)
    }

    /// Entries under the directory `path`, down to `depth` levels (1 = direct children; 0 is
    /// treated as 1; at most [`MAX_LIST_DEPTH`]). Symlinks are reported, never descended into.
    /// The answer is sorted by path and holds at most [`MAX_LIST_ENTRIES`] entries; the flag
    /// tells whether entries were left out. `path` itself may be a symlink to a directory (inside
    /// the root), which is followed.
    pub fn list(&self, path: &str, depth: u32) -> Result<(Vec<Entry>, bool), AgentError> {
        let abs = self.normalize(path)?;
        let fd = self
            .open_in_root(&abs, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NONBLOCK)
            .map_err(|e| errno_err("list", &abs, e))?;
        let mut walk = ListWalk {
            out: Vec::new(),
            truncated: false,
            max_depth: depth.clamp(1, MAX_LIST_DEPTH),
            depth_capped: depth > MAX_LIST_DEPTH,
        };
        walk.dir(fd, &abs, 1)
            .map_err(|e| errno_err("list", &abs, e))?;
        let mut out = walk.out;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok((out, walk.truncated))
    }

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

    /// Opens a regular file for reading (symlinks followed, inside the root).
    /// `IsADirectory` for directories, `InvalidPath` for devices, fifos and sockets (which are
    /// never opened for reading, so a fifo cannot block the agent), `TooLarge` when the file is
    /// bigger than `max_bytes`.
    pub fn open_read(&self, path: &str, max_bytes: Option<u64>) -> Result<File, AgentError> {
        const OP: &str = "read";
        let abs = self.normalize(path)?;
        // Look through an O_PATH descriptor first: that never opens the object itself.
        let probe = self
            .open_in_root(&abs, OFlags::PATH)
            .map_err(|e| errno_err(OP, &abs, e))?;
        let st = fd_statx(probe.as_fd()).map_err(|e| errno_err(OP, &abs, e))?;
        check_readable(&st, &abs, max_bytes)?;
        drop(probe);
        // The object may have been swapped since: open non-blocking and check again.
        let fd = self
            .open_in_root(&abs, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY)
            .map_err(|e| errno_err(OP, &abs, e))?;
        let st = fd_statx(fd.as_fd()).map_err(|e| errno_err(OP, &abs, e))?;
        check_readable(&st, &abs, max_bytes)?;
        let flags = rfs::fcntl_getfl(&fd).map_err(|e| errno_err(OP, &abs, e))?;
        rfs::fcntl_setfl(&fd, flags.difference(OFlags::NONBLOCK))
            .map_err(|e| errno_err(OP, &abs, e))?;
        Ok(File::from(fd))
    }

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
        Ok(pending)
    }

    // ---- path handling ----

    /// Validates a request path and turns it into a normalised absolute in-sandbox path.
    fn normalize(&self, path: &str) -> Result<String, AgentError> {
        check_raw(path).map_err(|why| invalid("path", path, why))?;
        if path.starts_with('/') {
            Ok(lexical_normalize(path))
        } else {
            Ok(lexical_normalize(&format!("{}/{}", self.default_dir, path)))
        }
    }

    /// `openat2` of a normalised absolute path, inside the root, no magic links.
    fn open_in_root(&self, abs: &str, flags: OFlags) -> Result<OwnedFd, Errno> {
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
    fn open_dir_path(&self, op: &str, dir: &str, full: &str) -> Result<OwnedFd, AgentError> {
        self.open_in_root(dir, OFlags::PATH | OFlags::DIRECTORY)
            .map_err(|e| errno_err(op, full, e))
    }

    /// lstat-style entry of a normalised absolute path.
    fn lstat_abs(&self, op: &str, abs: &str) -> Result<Entry, AgentError> {
        match split_parent(abs) {
            None => {
                let st = fd_statx(self.root.as_fd()).map_err(|e| errno_err(op, abs, e))?;
                Ok(entry_from("/".to_owned(), abs.to_owned(), &st, None))
            }
            Some((parent, name)) => {
                let pfd = self.open_dir_path(op, parent, abs)?;
                entry_at(pfd.as_fd(), name, name, abs.to_owned()).map_err(|e| errno_err(op, abs, e))
            }
        }
    }

    /// `mkdir -p` of a normalised absolute path; what it creates belongs to `owner` if given.
    fn make_dir_abs(
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
            let pfd = parent.as_ref().map_or(self.root.as_fd(), |fd| fd.as_fd());
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

// ---- listing ----

struct ListWalk {
    out: Vec<Entry>,
    truncated: bool,
    max_depth: u32,
    /// The requested depth was above [`MAX_LIST_DEPTH`].
    depth_capped: bool,
}

impl ListWalk {
    /// Adds the entries of the directory `fd` (whose in-sandbox path is `path`, at `level`).
    fn dir(&mut self, fd: OwnedFd, path: &str, level: u32) -> Result<(), Errno> {
        // Only the smallest `budget` names of this directory can ever be reported (each takes at
        // least one slot): keep those, plus one to know whether more exist.
        let budget = MAX_LIST_ENTRIES.saturating_sub(self.out.len()) + 1;
        let mut smallest: BinaryHeap<CString> = BinaryHeap::new();
        let mut dir = Dir::new(fd)?;
        while let Some(item) = dir.read() {
            let item = item?;
            let name = item.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            smallest.push(name.to_owned());
            if smallest.len() > budget {
                smallest.pop();
            }
        }
        let dfd = dir.fd()?;
        for name in smallest.into_sorted_vec() {
            if self.out.len() >= MAX_LIST_ENTRIES {
                self.truncated = true;
                return Ok(());
            }
            let child = join(path, &name.to_string_lossy());
            let display = name.to_string_lossy().into_owned();
            let entry = match entry_at(dfd, name.as_c_str(), display, child) {
                Ok(entry) => entry,
                // Vanished meanwhile, or not inspectable: leave it out.
                Err(_) => continue,
            };
            let is_dir = entry.kind == EntryKind::Dir;
            let child_path = entry.path.clone();
            self.out.push(entry);
            if !is_dir {
                continue;
            }
            if level >= self.max_depth {
                if self.depth_capped {
                    self.truncated = true;
                }
                continue;
            }
            // A single plain name with O_NOFOLLOW: never leaves this directory, never follows a
            // symlink (one swapped in since the lstat makes the open fail and is skipped).
            let flags = OFlags::RDONLY
                | OFlags::DIRECTORY
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::CLOEXEC;
            if let Ok(sub) = rfs::openat(dfd, name.as_c_str(), flags, Mode::empty()) {
                // An unreadable subdirectory is listed without its content.
                let _ = self.dir(sub, &child_path, level + 1);
                if self.truncated {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

// ---- removal ----

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

// ---- uploads ----

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

// ---- entries ----

fn fd_statx(fd: BorrowedFd<'_>) -> Result<Statx, Errno> {
    rfs::statx(fd, c"", AtFlags::EMPTY_PATH, StatxFlags::BASIC_STATS)
}

fn file_type(st: &Statx) -> FileType {
    FileType::from_raw_mode(u32::from(st.stx_mode))
}

/// lstat-style entry of `name` in `dir`.
fn entry_at<P: rustix::path::Arg + Copy>(
    dir: BorrowedFd<'_>,
    name: P,
    display_name: impl Into<String>,
    path: String,
) -> Result<Entry, Errno> {
    let st = rfs::statx(
        dir,
        name,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    )?;
    let target = if file_type(&st) == FileType::Symlink {
        rfs::readlinkat(dir, name, Vec::new())
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    Ok(entry_from(display_name.into(), path, &st, target))
}

fn entry_from(name: String, path: String, st: &Statx, symlink_target: Option<String>) -> Entry {
    let kind = match file_type(st) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    let modified_ms = st
        .stx_mtime
        .tv_sec
        .saturating_mul(1000)
        .saturating_add(i64::from(st.stx_mtime.tv_nsec / 1_000_000));
    Entry {
        name,
        path,
        kind,
        size: st.stx_size,
        mode: u32::from(st.stx_mode) & 0o7777,
        modified_ms,
        symlink_target,
        uid: st.stx_uid,
        gid: st.stx_gid,
    }
}

/// Refuses what `open_read` must not hand out.
fn check_readable(st: &Statx, abs: &str, max_bytes: Option<u64>) -> Result<(), AgentError> {
    match file_type(st) {
        FileType::RegularFile => {}
        FileType::Directory => return Err(is_a_directory("read", abs)),
        _ => return Err(invalid("read", abs, "not a regular file")),
    }
    match max_bytes {
        Some(max) if st.stx_size > max => Err(AgentError::new(
            ErrorCode::TooLarge,
            format!(
                "read {}: {} bytes, more than the limit of {max}",
                shown(abs),
                st.stx_size
            ),
        )),
        _ => Ok(()),
    }
}

// ---- paths ----

/// Checks a raw request path before any interpretation.
fn check_raw(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        Err("empty path")
    } else if path.contains('\0') {
        Err("path contains a NUL byte")
    } else if path.len() > MAX_PATH_BYTES {
        Err("path too long")
    } else {
        Ok(())
    }
}

/// Normalises a path lexically into an absolute path: drops empty and `.` components, `..`
/// removes the previous component (and stays at the root at the top).
fn lexical_normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for component in path.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    if parts.is_empty() {
        return "/".to_owned();
    }
    let mut out = String::with_capacity(path.len() + 1);
    for part in parts {
        out.push('/');
        out.push_str(part);
    }
    out
}

/// The normalised absolute path as a path relative to the root descriptor.
fn relative(abs: &str) -> &str {
    let rel = abs.trim_start_matches('/');
    if rel.is_empty() {
        "."
    } else {
        rel
    }
}

/// Parent path and last name of a normalised absolute path; `None` for the root.
fn split_parent(abs: &str) -> Option<(&str, &str)> {
    let index = abs.rfind('/')?;
    let name = &abs[index + 1..];
    if name.is_empty() {
        return None;
    }
    let parent = if index == 0 { "/" } else { &abs[..index] };
    Some((parent, name))
}

fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

// ---- errors ----

fn code_of(e: Errno) -> ErrorCode {
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

fn describe(e: Errno) -> String {
    match e {
        Errno::LOOP => "too many levels of symbolic links, or a /proc magic link".to_owned(),
        Errno::XDEV => "path escapes the sandbox root".to_owned(),
        _ => std::io::Error::from_raw_os_error(e.raw_os_error()).to_string(),
    }
}

/// Sandbox ids beyond the 65536 a sandbox maps would fail the chown with a puzzling EINVAL.
fn check_owner(owner: Option<(u32, u32)>) -> Result<(), AgentError> {
    match owner {
        Some((uid, gid)) if uid >= MAPPED_IDS || gid >= MAPPED_IDS => Err(AgentError::new(
            ErrorCode::InvalidRequest,
            format!("owner {uid}:{gid}: sandbox ids are below {MAPPED_IDS}"),
        )),
        _ => Ok(()),
    }
}

fn chown_fd(fd: BorrowedFd<'_>, (uid, gid): (u32, u32)) -> Result<(), Errno> {
    rfs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    )
}

fn errno_err(op: &str, path: &str, e: Errno) -> AgentError {
    AgentError::new(code_of(e), format!("{op} {}: {}", shown(path), describe(e)))
}

fn io_err(op: &str, path: &str, e: &std::io::Error) -> AgentError {
    match Errno::from_io_error(e) {
        Some(errno) => errno_err(op, path, errno),
        None => AgentError::new(ErrorCode::Io, format!("{op} {}: {e}", shown(path))),
    }
}

fn invalid(op: &str, path: &str, why: &str) -> AgentError {
    AgentError::new(
        ErrorCode::InvalidPath,
        format!("{op} {}: {why}", shown(path)),
    )
}

fn is_a_directory(op: &str, path: &str) -> AgentError {
    AgentError::new(
        ErrorCode::IsADirectory,
        format!("{op} {}: is a directory", shown(path)),
    )
}

fn not_a_dir_in_the_way(op: &str, path: &str, last: bool) -> AgentError {
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
fn shown(path: &str) -> String {
    const MAX_CHARS: usize = 256;
    if path.chars().count() > MAX_CHARS {
        let head: String = path.chars().take(MAX_CHARS).collect();
        format!("{head:?}...")
    } else {
        format!("{path:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};
    use std::path::PathBuf;
    use std::time::Duration;

    /// A sandbox root with `/workspace` and `/etc/passwd`, plus a separate "host" directory
    /// outside it holding a distinctive secret file.
    struct Env {
        root: tempfile::TempDir,
        host: tempfile::TempDir,
        fs: Fs,
    }

    const SANDBOX_PASSWD: &[u8] = b"sandbox-passwd\n";
    const HOST_SECRET: &[u8] = b"HOST-SECRET-do-not-leak\n";

    impl Env {
        fn new() -> Self {
            let root = tempfile::tempdir().unwrap();
            let host = tempfile::tempdir().unwrap();
            std::fs::create_dir(root.path().join("workspace")).unwrap();
            std::fs::create_dir(root.path().join("etc")).unwrap();
            std::fs::write(root.path().join("etc/passwd"), SANDBOX_PASSWD).unwrap();
            std::fs::write(host.path().join("secret"), HOST_SECRET).unwrap();
            std::fs::create_dir(host.path().join("dir")).unwrap();
            std::fs::write(host.path().join("dir/keep"), b"keep").unwrap();
            let fs = Fs::new(root.path(), "/workspace").unwrap();
            Env { root, host, fs }
        }

        /// Host path of an in-sandbox path.
        fn p(&self, sandbox_path: &str) -> PathBuf {
            self.root.path().join(sandbox_path.trim_start_matches('/'))
        }

        fn host_secret(&self) -> PathBuf {
            self.host.path().join("secret")
        }

        fn read(&self, path: &str) -> Result<Vec<u8>, AgentError> {
            let mut file = self.fs.open_read(path, None)?;
            let mut buf = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut buf).unwrap();
            Ok(buf)
        }

        fn write(&self, path: &str, data: &[u8]) -> Result<Entry, AgentError> {
            let mut w = self.fs.begin_write(&req(path))?;
            w.write(data)?;
            w.commit()
        }

        fn assert_host_intact(&self) {
            assert_eq!(std::fs::read(self.host_secret()).unwrap(), HOST_SECRET);
            assert_eq!(
                std::fs::read(self.host.path().join("dir/keep")).unwrap(),
                b"keep"
            );
        }

        /// Names in a host directory.
        fn names(&self, sandbox_dir: &str) -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(self.p(sandbox_dir))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        }
    }

    fn req(path: &str) -> WriteFileRequest {
        WriteFileRequest {
            path: path.to_owned(),
            mode: None,
            create_parents: false,
            max_bytes: None,
            owner: None,
        }
    }

    fn code<T: std::fmt::Debug>(result: Result<T, AgentError>) -> ErrorCode {
        match result {
            Ok(v) => panic!("expected an error, got {v:?}"),
            Err(e) => e.code,
        }
    }

    fn mode_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn lexical_normalisation() {
        assert_eq!(lexical_normalize("/"), "/");
        assert_eq!(lexical_normalize("/a//b/./c/"), "/a/b/c");
        assert_eq!(lexical_normalize("/workspace/x/.."), "/workspace");
        assert_eq!(lexical_normalize("/../../etc/passwd"), "/etc/passwd");
        assert_eq!(lexical_normalize("a/../../.."), "/");
        assert_eq!(split_parent("/"), None);
        assert_eq!(split_parent("/a"), Some(("/", "a")));
        assert_eq!(split_parent("/a/b"), Some(("/a", "b")));
    }

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

    #[test]
    fn open_read_checks_type_and_size() {
        let env = Env::new();
        std::fs::write(env.p("/workspace/f"), vec![7u8; 100]).unwrap();
        assert_eq!(
            code(env.fs.open_read("/workspace/f", Some(99))),
            ErrorCode::TooLarge
        );
        assert_eq!(
            env.fs
                .open_read("/workspace/f", Some(100))
                .unwrap()
                .metadata()
                .unwrap()
                .len(),
            100
        );
        assert_eq!(
            code(env.fs.open_read("/workspace", None)),
            ErrorCode::IsADirectory
        );
        assert_eq!(code(env.fs.open_read("/", None)), ErrorCode::IsADirectory);
        assert_eq!(
            code(env.fs.open_read("/workspace/none", None)),
            ErrorCode::NotFound
        );
        symlink("f", env.p("/workspace/l")).unwrap();
        assert_eq!(env.read("/workspace/l").unwrap().len(), 100);
        let _listener = std::os::unix::net::UnixListener::bind(env.p("/workspace/sock")).unwrap();
        assert_eq!(
            code(env.fs.open_read("/workspace/sock", None)),
            ErrorCode::InvalidPath
        );
        // The returned file is blocking again.
        let file = env.fs.open_read("/workspace/f", None).unwrap();
        let flags = rfs::fcntl_getfl(&file).unwrap();
        assert!(!flags.contains(OFlags::NONBLOCK));
    }

    #[test]
    fn open_read_fifo_does_not_block() {
        let env = Env::new();
        rfs::mknodat(
            rfs::CWD,
            env.p("/workspace/fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let fs = env.fs;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(fs.open_read("/workspace/fifo", None).map(|_| ()));
        });
        let result = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("open_read blocked on a fifo");
        assert_eq!(code(result), ErrorCode::InvalidPath);
    }

    #[test]
    fn list_depth_sorting_and_symlinks() {
        let env = Env::new();
        std::fs::create_dir_all(env.p("/workspace/a/b/c")).unwrap();
        std::fs::write(env.p("/workspace/a/b/c/deep"), b"").unwrap();
        std::fs::write(env.p("/workspace/a/x"), b"xx").unwrap();
        std::fs::write(env.p("/workspace/a-z"), b"").unwrap();
        std::fs::write(env.p("/workspace/z"), b"").unwrap();
        symlink("/workspace/a", env.p("/workspace/link")).unwrap();
        symlink(env.host.path(), env.p("/workspace/hostlink")).unwrap();

        let (entries, truncated) = env.fs.list("/workspace", 1).unwrap();
        assert!(!truncated);
        let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/workspace/a",
                "/workspace/a-z",
                "/workspace/hostlink",
                "/workspace/link",
                "/workspace/z"
            ]
        );
        let link = &entries[3];
        assert_eq!(link.kind, EntryKind::Symlink);
        assert_eq!(link.symlink_target.as_deref(), Some("/workspace/a"));

        let (entries, truncated) = env.fs.list("/workspace", 2).unwrap();
        assert!(!truncated);
        let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/workspace/a",
                "/workspace/a-z",
                "/workspace/a/b",
                "/workspace/a/x",
                "/workspace/hostlink",
                "/workspace/link",
                "/workspace/z"
            ]
        );
        assert_eq!(entries[3].size, 2);
        // Deep listing never descends into symlinks (nor reaches the host).
        let (entries, _) = env.fs.list("/", 100).unwrap();
        assert!(entries.iter().any(|e| e.path == "/workspace/a/b/c/deep"));
        assert!(entries
            .iter()
            .all(|e| !e.path.starts_with("/workspace/link/")));
        assert!(entries
            .iter()
            .all(|e| !e.path.starts_with("/workspace/hostlink/")));
        assert!(entries.windows(2).all(|w| w[0].path < w[1].path));
        // depth 0 means direct children.
        assert_eq!(env.fs.list("/workspace", 0).unwrap().0.len(), 5);
        // Listing through a symlink to a directory works (inside the root).
        let (entries, _) = env.fs.list("/workspace/link", 1).unwrap();
        assert_eq!(entries[0].path, "/workspace/link/b");
        assert_eq!(
            code(env.fs.list("/workspace/z", 1)),
            ErrorCode::NotADirectory
        );
        assert_eq!(code(env.fs.list("/workspace/none", 1)), ErrorCode::NotFound);
        env.assert_host_intact();
    }

    #[test]
    fn list_truncates_at_the_limit() {
        let env = Env::new();
        let dir = env.p("/workspace/many");
        std::fs::create_dir(&dir).unwrap();
        for i in 0..MAX_LIST_ENTRIES + 10 {
            std::fs::write(dir.join(format!("f{i:05}")), b"").unwrap();
        }
        let (entries, truncated) = env.fs.list("/workspace/many", 1).unwrap();
        assert!(truncated);
        assert_eq!(entries.len(), MAX_LIST_ENTRIES);
        // The first names in order are the ones kept.
        assert_eq!(entries[0].name, "f00000");
        assert_eq!(
            entries[MAX_LIST_ENTRIES - 1].name,
            format!("f{:05}", MAX_LIST_ENTRIES - 1)
        );
        // Exactly at the limit: not truncated.
        for i in MAX_LIST_ENTRIES..MAX_LIST_ENTRIES + 10 {
            std::fs::remove_file(dir.join(format!("f{i:05}"))).unwrap();
        }
        let (entries, truncated) = env.fs.list("/workspace/many", 1).unwrap();
        assert!(!truncated);
        assert_eq!(entries.len(), MAX_LIST_ENTRIES);
        // Nested: the parent directory counts as one entry too.
        let (entries, truncated) = env.fs.list("/workspace", 2).unwrap();
        assert!(truncated);
        assert_eq!(entries.len(), MAX_LIST_ENTRIES);
    }

    #[test]
    fn unicode_names_round_trip() {
        let env = Env::new();
        let dir = "/workspace/ünïcødé/日本語";
        env.fs.make_dir(dir, None).unwrap();
        let path = format!("{dir}/🎉 fête.txt");
        let e = env.write(&path, "données".as_bytes()).unwrap();
        assert_eq!(e.name, "🎉 fête.txt");
        assert_eq!(e.path, path);
        assert_eq!(env.read(&path).unwrap(), "données".as_bytes());
        let (entries, _) = env.fs.list(dir, 1).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].path, path);
        assert_eq!(env.fs.stat(&path).unwrap().name, "🎉 fête.txt");
        let moved = env.fs.rename(&path, "/workspace/ünïcødé/ok.txt").unwrap();
        assert_eq!(moved.name, "ok.txt");
        env.fs.remove("/workspace/ünïcødé", true).unwrap();
        assert!(env.names("/workspace").is_empty());
    }

    #[test]
    fn stat_root_and_dot_components() {
        let env = Env::new();
        let e = env.fs.stat("/").unwrap();
        assert_eq!(
            (e.name.as_str(), e.path.as_str(), e.kind),
            ("/", "/", EntryKind::Dir)
        );
        let e = env.fs.stat("/workspace/x/..").unwrap();
        assert_eq!(e.path, "/workspace");
        assert_eq!(e.name, "workspace");
        let e = env.fs.stat(".").unwrap();
        assert_eq!(e.path, "/workspace");
        let e = env.fs.stat("/etc/./passwd/").unwrap();
        assert_eq!(e.size, SANDBOX_PASSWD.len() as u64);
        assert_eq!(e.mode, mode_of(&env.p("/etc/passwd")));
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
