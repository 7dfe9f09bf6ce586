//! The supplementary groups of a process the agent starts as another account: what a login's
//! `initgroups` gives it, from the sandbox's own /etc/passwd and /etc/group. Read at every
//! such spawn, as the sandbox may change its accounts at any moment (a `usermod -aG`, a
//! template's `useradd`), but parsed again only when either file changed: otherwise a spawn
//! costs two `stat`s.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::accounts::groups_of;

/// The most of either file read (a system's takes a few KiB); a larger one counts as empty.
const MAX_FILE: u64 = 1 << 20;
/// Linux's NGROUPS_MAX: `setgroups` refuses a longer list.
const MAX_GROUPS: usize = 65536;

/// What tells a file's content changed: a rewrite in place changes its size or change time, a
/// replacement (`useradd`, an editor, `sed -i`) its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Version {
    dev: u64,
    ino: u64,
    size: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
}

fn version(path: &Path) -> Option<Version> {
    let m = std::fs::metadata(path).ok()?;
    Some(Version {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        ctime: (m.ctime(), m.ctime_nsec()),
        mtime: (m.mtime(), m.mtime_nsec()),
    })
}

/// The file's text, or none: opened without blocking (a FIFO put in its place never holds up
/// a spawn) and taken only if it is a regular file of at most [`MAX_FILE`].
fn read(path: &Path) -> String {
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    else {
        return String::new();
    };
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return String::new();
    }
    let mut bytes = Vec::new();
    match file.take(MAX_FILE + 1).read_to_end(&mut bytes) {
        Ok(n) if n as u64 <= MAX_FILE => String::from_utf8_lossy(&bytes).into_owned(),
        _ => String::new(),
    }
}

/// The account files of one root, parsed once per version.
pub(crate) struct Groups {
    passwd: PathBuf,
    group: PathBuf,
    /// Which gids a process here can hold: those its user namespace maps.
    mapped: Vec<(u32, u32)>,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    versions: Option<[Option<Version>; 2]>,
    passwd: String,
    group: String,
    lists: HashMap<(u32, u32), Arc<[libc::gid_t]>>,
}

impl Groups {
    fn new(root: &Path, gid_map: &str) -> Groups {
        Groups {
            passwd: root.join("etc/passwd"),
            group: root.join("etc/group"),
            mapped: mapped_ranges(gid_map),
            cache: Mutex::new(Cache::default()),
        }
    }

    /// The sandbox's own, as the agent sees it (its root is the sandbox's).
    pub(crate) fn sandbox() -> &'static Groups {
        static GROUPS: OnceLock<Groups> = OnceLock::new();
        GROUPS.get_or_init(|| {
            let map = std::fs::read_to_string("/proc/self/gid_map").unwrap_or_default();
            Groups::new(Path::new("/"), &map)
        })
    }

    /// The groups of account `uid` with primary group `gid`: `gid`, then those the files list
    /// it in that this namespace maps (a gid it cannot map would make `setgroups` fail, and
    /// the spawn with it), at most NGROUPS_MAX.
    pub(crate) fn of(&self, uid: u32, gid: u32) -> Arc<[libc::gid_t]> {
        let versions = [version(&self.passwd), version(&self.group)];
        let mut cache = self.cache.lock();
        if cache.versions != Some(versions) {
            *cache = Cache {
                versions: Some(versions),
                passwd: read(&self.passwd),
                group: read(&self.group),
                lists: HashMap::new(),
            };
        }
        let Cache {
            passwd,
            group,
            lists,
            ..
        } = &mut *cache;
        lists
            .entry((uid, gid))
            .or_insert_with(|| {
                groups_of(passwd, group, uid, gid)
                    .into_iter()
                    .filter(|&g| g == gid || self.maps(g))
                    .take(MAX_GROUPS)
                    .collect()
            })
            .clone()
    }

    fn maps(&self, gid: u32) -> bool {
        self.mapped
            .iter()
            .any(|&(first, count)| gid.checked_sub(first).is_some_and(|off| off < count))
    }
}

/// The inner ranges (first id, count) of a `/proc/<pid>/gid_map`; an unreadable one maps
/// nothing more than the primary group.
fn mapped_ranges(map: &str) -> Vec<(u32, u32)> {
    map.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            Some((f.first()?.parse().ok()?, f.get(2)?.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str =
        "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n";

    fn root_with(group: &str) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        std::fs::write(root.path().join("etc/passwd"), PASSWD).unwrap();
        std::fs::write(root.path().join("etc/group"), group).unwrap();
        root
    }

    #[test]
    fn a_change_to_the_files_is_seen_at_the_next_spawn() {
        let root = root_with("user:x:1000:\n");
        let groups = Groups::new(root.path(), "0 100000 65536\n");
        assert_eq!(&*groups.of(1000, 1000), [1000]);
        // Appended in place (`usermod -aG` rewrites; `>>` appends): size and times change.
        let path = root.path().join("etc/group");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("devs:x:2345:user\n");
        std::fs::write(&path, &text).unwrap();
        assert_eq!(&*groups.of(1000, 1000), [1000, 2345]);
        // Replaced by another file of the same size.
        let other = root.path().join("etc/group.new");
        std::fs::write(&other, text.replace("2345", "2346")).unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert_eq!(&*groups.of(1000, 1000), [1000, 2346]);
        // Gone: the primary group alone.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(&*groups.of(1000, 1000), [1000]);
    }

    #[test]
    fn only_mapped_groups_are_given() {
        let root = root_with("big:x:70000:user\nsmall:x:20:user\n");
        let groups = Groups::new(root.path(), "0 100000 65536\n");
        assert_eq!(&*groups.of(1000, 1000), [1000, 20]);
        let everything = Groups::new(root.path(), "0 0 4294967295\n");
        assert_eq!(&*everything.of(1000, 1000), [1000, 70000, 20]);
        assert_eq!(&*Groups::new(root.path(), "").of(1000, 1000), [1000]);
    }

    #[test]
    fn hostile_files_give_the_primary_group_only() {
        let root = root_with(&"x".repeat(MAX_FILE as usize + 1));
        let groups = Groups::new(root.path(), "0 0 4294967295\n");
        assert_eq!(&*groups.of(1000, 1000), [1000]);
        std::fs::remove_file(root.path().join("etc/group")).unwrap();
        std::fs::create_dir(root.path().join("etc/group")).unwrap();
        assert_eq!(&*groups.of(1000, 1000), [1000]);
        std::fs::remove_dir(root.path().join("etc/group")).unwrap();
        std::fs::write(
            root.path().join("etc/group"),
            b"devs:x:7:user\n\xff\xfe:x:8:user\n",
        )
        .unwrap();
        assert_eq!(&*groups.of(1000, 1000), [1000, 7, 8]);
    }
}
