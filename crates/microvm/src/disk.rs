//! Root disks of store images (language packs, templates, imports): the read-only ext4
//! filesystem a microVM boots an image from, made from the image's own tree with
//! `mkfs.ext4 -d` the first time a VM needs it (a create, or a warm pool filling), kept in the
//! store beside the tree as a derived file (complete once visible, never changed, deleted with
//! the image) and shared read-only by every VM on the image.
//!
//! The tree is surveyed first and must hold only directories, regular files and symlinks on
//! one filesystem, as the store makes them: `mkfs.ext4 -d` copies a symlink as a symlink
//! (never following it: `usr -> /` lands as that link, not as the host's /usr), but it copies
//! device nodes and fifos as they are, and it would descend into a filesystem mounted inside
//! the tree. Such a tree is no store image and is refused.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use koder_image::{ImageStore, StoredImage};

use crate::image::ImageError;

/// Bumped when what a disk holds or how it is made changes: older disks are rebuilt under the
/// new name and removed.
pub const DISK_VERSION: u32 = 1;
const DISK_PREFIX: &str = "microvm-root-v";
const BLOCK: u64 = 4096;
/// Bytes of one inode on the disk (room for nanosecond timestamps past 2038).
const INODE_BYTES: u64 = 256;

/// The store file name of this version's disk.
pub fn disk_name() -> String {
    format!("{DISK_PREFIX}{DISK_VERSION}.ext4")
}

/// The root disk of `image`, built first when it has none. Blocking (seconds for a language
/// pack); callers build one image's disk at a time, and a concurrent builder elsewhere (another
/// daemon on the same store) loses nothing but its work: the first disk installed stays.
pub fn ensure(store: &ImageStore, image: &StoredImage) -> Result<PathBuf, ImageError> {
    let name = disk_name();
    let existing = image.derived(&name);
    if existing.is_file() {
        return Ok(existing);
    }
    let started = Instant::now();
    let size = survey(&image.root)?;
    let scratch = store.scratch("microvm-disk");
    mkfs(&image.root, scratch.path(), &size)?;
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o444))
        .map_err(io("protect the image's root disk"))?;
    let disk = store
        .install_derived(image, &name, scratch.path(), DISK_PREFIX)
        .map_err(|e| ImageError::Tool {
            what: "install the image's root disk".into(),
            detail: e.to_string(),
        })?;
    tracing::info!(
        image = %image.manifest.name,
        digest = %image.manifest.digest,
        files = size.inodes,
        took = ?started.elapsed(),
        "microVM root disk built"
    );
    Ok(disk)
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> ImageError {
    move |e| ImageError::Io(what.into(), e)
}

/// What a tree needs on an ext4 disk.
#[derive(Debug, Default, PartialEq, Eq)]
struct TreeSize {
    /// Data and directory blocks, in bytes.
    bytes: u64,
    /// Entries (each one inode).
    inodes: u64,
}

impl TreeSize {
    /// The filesystem size for `mkfs`: the data with a tenth of slack, the inode tables, and
    /// room for ext4's own metadata (group descriptors, bitmaps, lost+found).
    fn disk_kib(&self) -> u64 {
        let bytes = self.bytes + self.bytes / 10 + self.inodes * INODE_BYTES + (32 << 20);
        bytes.div_ceil(1024)
    }
}

/// Sizes the tree at `root`, refusing anything a store tree never holds: a root that is no
/// directory, device nodes, fifos, sockets, and directories of another filesystem.
fn survey(root: &Path) -> Result<TreeSize, ImageError> {
    let meta = std::fs::symlink_metadata(root).map_err(io("read the image tree"))?;
    if !meta.is_dir() {
        return Err(refused(root, root, "is no directory"));
    }
    let dev = meta.dev();
    let mut size = TreeSize::default();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        size.inodes += 1;
        let mut dir_bytes = 0;
        for entry in std::fs::read_dir(&dir).map_err(io("read the image tree"))? {
            let entry = entry.map_err(io("read the image tree"))?;
            let path = entry.path();
            // A directory entry: its name plus ext4's 8-byte header, 4-byte aligned.
            dir_bytes += (entry.file_name().len() as u64 + 8).next_multiple_of(4);
            let meta = std::fs::symlink_metadata(&path).map_err(io("read the image tree"))?;
            let ft = meta.file_type();
            if ft.is_dir() {
                if meta.dev() != dev {
                    return Err(refused(root, &path, "is another filesystem's mount point"));
                }
                dirs.push(path);
            } else if ft.is_file() {
                size.inodes += 1;
                size.bytes += meta.len().next_multiple_of(BLOCK);
            } else if ft.is_symlink() {
                size.inodes += 1;
                // Targets up to 59 bytes live in the inode itself.
                if meta.len() > 59 {
                    size.bytes += BLOCK;
                }
            } else {
                return Err(refused(
                    root,
                    &path,
                    "is a device node, fifo or socket (a store image holds none)",
                ));
            }
        }
        size.bytes += dir_bytes.max(1).next_multiple_of(BLOCK);
    }
    Ok(size)
}

fn refused(root: &Path, path: &Path, why: &str) -> ImageError {
    let shown = path.strip_prefix(root).unwrap_or(path);
    ImageError::UnsafeTree(format!("/{} {why}", shown.display()))
}

/// Writes the filesystem holding `root`'s tree to `out` (created; sparse where empty).
fn mkfs(root: &Path, out: &Path, size: &TreeSize) -> Result<(), ImageError> {
    let out = Command::new("mkfs.ext4")
        // Read-only for every guest: no journal, no reserved blocks; files keep the tree's
        // owners (the sandbox's ids, as a jail maps them).
        .args([
            "-q",
            "-F",
            "-L",
            "koder-root",
            "-O",
            "^has_journal",
            "-m",
            "0",
        ])
        .args(["-E", "root_owner=0:0"])
        .args(["-b", &BLOCK.to_string(), "-I", &INODE_BYTES.to_string()])
        .args(["-N", &(size.inodes + 1024).to_string()])
        .arg("-d")
        .arg(root)
        .arg(out)
        .arg(format!("{}k", size.disk_kib()))
        .output()
        .map_err(|e| ImageError::Tool {
            what: "mkfs.ext4".into(),
            detail: e.to_string(),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(ImageError::Tool {
            what: "make the image's root disk (mkfs.ext4 -d)".into(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    /// What `debugfs` says about `path` on `disk` (it reads the filesystem without mounting).
    fn debugfs(disk: &Path, request: &str) -> String {
        let out = Command::new("debugfs")
            .arg("-R")
            .arg(request)
            .arg(disk)
            .output()
            .expect("debugfs (e2fsprogs)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn survey_counts_what_the_disk_needs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::write(root.join("usr/bin/a"), vec![1u8; 5000]).unwrap();
        std::fs::write(root.join("empty"), b"").unwrap();
        symlink("usr/bin/a", root.join("short")).unwrap();
        symlink("x".repeat(100), root.join("long")).unwrap();
        let size = survey(root).unwrap();
        // 3 directories, 2 files, 2 symlinks.
        assert_eq!(size.inodes, 7);
        // a: 2 blocks, the long link: 1, each directory: 1.
        assert_eq!(size.bytes, (2 + 1 + 3) * BLOCK);
        assert!(size.disk_kib() > 32 << 10);
    }

    #[test]
    fn survey_refuses_what_no_store_tree_holds() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        std::fs::create_dir_all(root.join("dev")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("dev/fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let err = survey(&root).unwrap_err().to_string();
        assert!(
            err.contains("/dev/fifo") && err.contains("device node"),
            "{err}"
        );
        std::fs::remove_file(root.join("dev/fifo")).unwrap();
        symlink(&root, dir.path().join("link")).unwrap();
        let err = survey(&dir.path().join("link")).unwrap_err().to_string();
        assert!(err.contains("no directory"), "{err}");
        if is_root() {
            // A character device named like the guest's /dev/kvm.
            rustix::fs::mknodat(
                rustix::fs::CWD,
                root.join("dev/kvm"),
                rustix::fs::FileType::CharacterDevice,
                rustix::fs::Mode::from_raw_mode(0o666),
                rustix::fs::makedev(10, 232),
            )
            .unwrap();
            let err = survey(&root).unwrap_err().to_string();
            assert!(err.contains("/dev/kvm"), "{err}");
        }
    }

    /// A hostile tree: links out of it (`usr -> /`, a file linked to the host's shadow file),
    /// device-like names as regular files and a name with a newline. The disk holds the links
    /// as links and nothing read from outside the tree.
    #[test]
    fn a_disk_holds_links_as_links_and_nothing_from_outside_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let digest = koder_image::store::digest_of(&"hostile").unwrap();
        let staging = store.staging(&digest).unwrap();
        let root = staging.rootfs();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(root.join("dev")).unwrap();
        symlink("/", root.join("usr")).unwrap();
        symlink("/etc/shadow", root.join("etc/passwd")).unwrap();
        symlink("/etc", root.join("escape")).unwrap();
        std::fs::write(root.join("etc/hostname"), b"sandbox\n").unwrap();
        std::fs::write(root.join("dev/sda"), b"just a file\n").unwrap();
        std::fs::write(root.join("odd\nname"), b"x").unwrap();
        let manifest =
            koder_image::Manifest::new("hostile", &digest, serde_json::json!({"kind": "test"}));
        let image = staging.commit(&manifest).unwrap();

        let disk = ensure(&store, &image).unwrap();
        assert_eq!(disk, image.derived(&disk_name()));
        let mode = std::fs::metadata(&disk).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o444);
        let usr = debugfs(&disk, "stat /usr");
        assert!(
            usr.contains("Type: symlink") && usr.contains("Size: 1"),
            "{usr}"
        );
        let passwd = debugfs(&disk, "stat /etc/passwd");
        assert!(passwd.contains("Type: symlink"), "{passwd}");
        assert_eq!(debugfs(&disk, "cat /etc/hostname"), "sandbox\n");
        assert_eq!(debugfs(&disk, "cat /dev/sda"), "just a file\n");
        // Nothing of the host's /usr or /etc came in through the links.
        let listing = debugfs(&disk, "ls -p /usr/bin");
        assert!(!listing.contains("mkfs.ext4"), "{listing}");
        let top = debugfs(&disk, "ls -p /");
        for name in ["usr", "escape", "etc", "dev"] {
            assert!(top.contains(&format!("/{name}/")), "{top}");
        }
        // Built once: a second call finds it, the same file.
        let ino = std::fs::metadata(&disk).unwrap().ino();
        assert_eq!(
            std::fs::metadata(ensure(&store, &image).unwrap())
                .unwrap()
                .ino(),
            ino
        );
        assert_eq!(
            std::fs::read_dir(store.root().join(".tmp"))
                .unwrap()
                .count(),
            0,
            "scratch left"
        );
    }
}
