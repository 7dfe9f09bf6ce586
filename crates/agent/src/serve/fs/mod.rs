//! File operations resolved inside the sandbox root only.
//!
//! The agent serves the daemon's file requests (stat, list, mkdir, remove, move, read, write).
//! Even though the agent has already `pivot_root`ed into the sandbox, every path is resolved
//! relative to a root directory descriptor with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`:
//! absolute symlinks, `..` chains and relative symlinks are all clamped to the root, and `/proc`
//! magic links (`/proc/self/root`, `/proc/<pid>/cwd`, `/proc/self/fd/N`, ...) are refused.
//!
//! Path handling:
//! * a request path must be non-empty, free of NUL bytes and at most
//!   [`MAX_PATH_BYTES`](koder_agent_protocol::MAX_PATH_BYTES) long;
//! * relative paths are joined to the default directory;
//! * the result is normalised lexically (`//` and `.` dropped, `..` pops the previous component,
//!   `..` at the root stays at the root), so `/workspace/x/..` is `/workspace`; that normalised
//!   absolute path is what [`Entry::path`](koder_agent_protocol::Entry::path) reports. Symlinks
//!   met while resolving are then followed by the kernel, inside the root.
//! * operations on the final component (lstat, unlink, rename, create) open the *parent* through
//!   `openat2` and act with `*at` calls on the plain last name, so a symlink as the final component
//!   is never followed by those operations. After normalisation the last component is always a
//!   plain name, or the path is the root itself: mutating the root (remove, rename, write) is
//!   refused (`InvalidPath`, or `IsADirectory` for a write).
//!
//! All operations are synchronous; the caller runs them on a blocking thread.
//!
//! Layout: `path` (lexical, no syscalls) and `entry`/`error`/`owner` (leaves) under `resolve`
//! (the root descriptor, `openat2`); `read`, `list`, `tree` and `write` add the operations to
//! [`Fs`] (`write` creates parents through `tree`).

mod entry;
mod error;
mod list;
mod owner;
mod path;
mod read;
mod resolve;
#[cfg(test)]
mod testenv;
mod tree;
mod write;
mod xattr;

pub use list::MAX_LIST_DEPTH;
pub use resolve::Fs;
pub use write::PendingWrite;

#[cfg(test)]
mod tests {
    use super::testenv::Env;

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
}
