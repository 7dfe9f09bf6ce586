//! Shared helpers for the layer tests (run as root: they chown, mknod and set trusted xattrs).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use koder_layer::{ApplyOptions, LayerError, Limits, Owners, Stats};
use rustix::fs::{AtFlags, Mode, OFlags, Timespec, Timestamps, CWD};

pub const ROOMY: Limits = Limits {
    max_bytes: 1 << 40,
    max_entries: 1 << 30,
};

pub fn open_dir(path: &Path) -> OwnedFd {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap()
}

pub fn capture(path: &Path, limits: &Limits) -> Result<(Vec<u8>, Stats), LayerError> {
    let mut out = Vec::new();
    let stats = koder_layer::capture(open_dir(path).as_fd(), &mut out, limits)?;
    Ok((out, stats))
}

pub fn apply(path: &Path, archive: &[u8], owners: Owners) -> Result<Stats, LayerError> {
    let opts = ApplyOptions {
        limits: ROOMY,
        owners,
    };
    koder_layer::apply(open_dir(path).as_fd(), archive, &opts)
}

pub fn p(s: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(s))
}

pub fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty()).unwrap();
}

pub fn whiteout(path: &Path) {
    rustix::fs::mknodat(
        CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        Mode::empty(),
        0,
    )
    .unwrap();
}

pub fn set_mtime(path: &Path, secs: i64) {
    let t = Timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    let times = Timestamps {
        last_access: t,
        last_modification: t,
    };
    rustix::fs::utimensat(CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW).unwrap();
}

/// Every node under `root` (not `root` itself), deepest first.
pub fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(root).unwrap() {
        let path = entry.unwrap().path();
        if fs::symlink_metadata(&path).unwrap().is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

/// Owner and mtime of everything under `root`, set without following symlinks.
pub fn own_and_date(root: &Path, uid: u32, gid: u32, mtime: i64) {
    for path in walk(root) {
        std::os::unix::fs::lchown(&path, Some(uid), Some(gid)).unwrap();
        set_mtime(&path, mtime);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub size: u64,
    pub content: Option<u64>,
    pub target: Option<Vec<u8>>,
    pub rdev: u64,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Relative path of the first node sharing this inode.
    pub same_inode_as: Option<Vec<u8>>,
}

/// Everything a layer should carry, by relative path.
pub fn snapshot(root: &Path) -> BTreeMap<Vec<u8>, Node> {
    let mut inodes: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut paths = walk(root);
    paths.sort();
    let mut out = BTreeMap::new();
    for path in paths {
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .as_os_str()
            .as_bytes()
            .to_vec();
        let md = fs::symlink_metadata(&path).unwrap();
        let ft = md.file_type();
        let kind = if ft.is_dir() {
            "dir"
        } else if ft.is_file() {
            "file"
        } else if ft.is_symlink() {
            "symlink"
        } else if ft.is_fifo() {
            "fifo"
        } else if ft.is_char_device() {
            "char"
        } else {
            "other"
        };
        let same_inode_as = if ft.is_file() && md.nlink() > 1 {
            let first = inodes.entry(md.ino()).or_insert_with(|| rel.clone());
            (*first != rel).then(|| first.clone())
        } else {
            None
        };
        let node = Node {
            kind,
            mode: md.mode() & 0o7777,
            uid: md.uid(),
            gid: md.gid(),
            mtime: md.mtime(),
            size: if ft.is_file() { md.size() } else { 0 },
            content: ft.is_file().then(|| hash(&fs::read(&path).unwrap())),
            target: ft.is_symlink().then(|| {
                fs::read_link(&path)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec()
            }),
            rdev: md.rdev(),
            xattrs: if ft.is_symlink() {
                BTreeMap::new()
            } else {
                xattrs(&path)
            },
            same_inode_as,
        };
        out.insert(rel, node);
    }
    out
}

fn hash(data: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    data.hash(&mut h);
    h.finish()
}

/// All xattrs of a file or directory, any namespace.
pub fn xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut list = vec![0u8; 65536];
    let n = rustix::fs::llistxattr(path, &mut list[..]).unwrap();
    let mut out = BTreeMap::new();
    for name in list[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let mut value = vec![0u8; 65536];
        let len = rustix::fs::lgetxattr(path, name, &mut value[..]).unwrap();
        out.insert(name.to_vec(), value[..len].to_vec());
    }
    out
}

/// A directory with `target/` to apply into and a `canary/` sibling whose state is checked
/// after every hostile apply.
pub struct Arena {
    pub dir: tempfile::TempDir,
}

impl Arena {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("target")).unwrap();
        fs::create_dir(dir.path().join("canary")).unwrap();
        fs::write(dir.path().join("canary/file"), b"canary").unwrap();
        Self { dir }
    }

    pub fn target(&self) -> PathBuf {
        self.dir.path().join("target")
    }

    pub fn apply(&self, archive: &[u8], owners: Owners) -> Result<Stats, LayerError> {
        apply(&self.target(), archive, owners)
    }

    /// Nothing next to the target changed, nor the host's files the attacks aim at.
    pub fn assert_outside_untouched(&self) {
        let mut names: Vec<_> = fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["canary", "target"]);
        assert_eq!(snapshot(&self.dir.path().join("canary")).len(), 1);
        assert_eq!(
            fs::read(self.dir.path().join("canary/file")).unwrap(),
            b"canary"
        );
        assert!(!self.dir.path().join("x").exists());
        assert!(fs::symlink_metadata("/koder-layer-test-abs").is_err());
        assert!(fs::symlink_metadata("/etc/koder-layer-test").is_err());
    }
}
