//! Listing directories: bounded, sorted, never descending into symlinks.

use std::collections::BinaryHeap;
use std::ffi::CString;
use std::os::fd::OwnedFd;

use koder_agent_protocol::{AgentError, Entry, EntryKind, MAX_FRAME_BYTES, MAX_LIST_ENTRIES};
use rustix::fs::{self as rfs, Dir, Mode, OFlags};
use rustix::io::Errno;

use super::entry::entry_at;
use super::error::errno_err;
use super::path::join;
use super::Fs;

/// Deepest level `list` descends to, whatever depth is asked (bounds open descriptors and
/// recursion); deeper directories make the answer flagged truncated.
pub const MAX_LIST_DEPTH: u32 = 128;

/// Most bytes of entries one answer carries (paths and metadata are the sandbox's to make
/// long), well inside the frame limit with room for the encoding's own overhead.
const ANSWER_BYTES: usize = MAX_FRAME_BYTES / 4 * 3;

/// Upper bound of an entry's encoded size: its strings plus the fixed fields and lengths.
fn encoded_bound(e: &Entry) -> usize {
    let strings = e.name.len() + e.path.len() + e.symlink_target.as_ref().map_or(0, String::len);
    let meta: usize = e.metadata.iter().map(|(k, v)| k.len() + v.len() + 20).sum();
    strings + meta + 64
}

impl Fs {
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
            bytes: 0,
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
}

struct ListWalk {
    out: Vec<Entry>,
    /// [`encoded_bound`] of `out`, kept within [`ANSWER_BYTES`].
    bytes: usize,
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
            let size = encoded_bound(&entry);
            if self.bytes + size > ANSWER_BYTES {
                self.truncated = true;
                return Ok(());
            }
            self.bytes += size;
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use koder_agent_protocol::{EntryKind, ErrorCode, MAX_LIST_ENTRIES};

    use super::super::testenv::{code, Env};

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
}
