//! Empty ext4 filesystems for sandbox writable layers (a jail's loop-mounted disk, a microVM's
//! scratch disk): one template per size, built once with `mkfs.ext4`, and per-sandbox copies
//! that cost the host only the template's few allocated blocks.

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use koder_runtime::RuntimeError;
use rustix::fs::SeekFrom;
use rustix::io::Errno;

/// Smallest size: mkfs.ext4 with our options accepts down to 256 KiB, so 1 MiB is the smallest
/// whole-MiB size (it has room for ~240 blocks and 64 inodes).
pub const MIN_SIZE_MIB: u64 = 1;
/// Largest size: 1 TiB. Its template holds ~16 MiB of metadata, copied per sandbox.
pub const MAX_SIZE_MIB: u64 = 1 << 20;

const MIB: u64 = 1024 * 1024;

/// Where an overlay-layer template keeps the overlay's upper and work directories (mode 0755
/// and 0700, owned by root), under a root of mode 0711 without `lost+found`.
pub const OVERLAY_UPPER: &str = "upper";
pub const OVERLAY_WORK: &str = "work";

/// Builds and caches one empty ext4 image per size in a directory of its own.
#[derive(Debug, Clone)]
pub struct Templates {
    dir: PathBuf,
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Scratch,
    Journaled,
    Overlay,
}

impl Templates {
    /// Templates of scratch filesystems (no journal: they die with their sandbox).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            kind: Kind::Scratch,
        }
    }

    /// Templates of filesystems that outlive sandboxes (volumes): with a journal, so a host
    /// crash costs at most the last writes, not the filesystem.
    pub fn journaled(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            kind: Kind::Journaled,
        }
    }

    /// Scratch templates laid out for an overlay's writable layer ([`OVERLAY_UPPER`],
    /// [`OVERLAY_WORK`]): what every copy would otherwise do after mounting (remove
    /// `lost+found`, which frees its blocks; make two directories) is done once here, so a
    /// sandbox's disk only needs its owner set.
    pub fn overlay(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            kind: Kind::Overlay,
        }
    }

    fn prefix(&self) -> &'static str {
        match self.kind {
            Kind::Scratch => "disk",
            Kind::Journaled => "journaled",
            Kind::Overlay => "overlay",
        }
    }

    /// The template for `size_mib`, built on first use. Builds go to a temporary name and are
    /// renamed into place, so concurrent callers and crashes never see a partial template.
    pub fn template(&self, size_mib: u64) -> Result<PathBuf, RuntimeError> {
        let bytes = size_bytes(size_mib)?;
        let prefix = self.prefix();
        let path = self.dir.join(format!("{prefix}-{size_mib}m.img"));
        if is_template(&path, bytes) {
            return Ok(path);
        }
        std::fs::create_dir_all(&self.dir)
            .map_err(RuntimeError::io(format!("create {}", self.dir.display())))?;
        remove_stale_builds(&self.dir);
        static BUILD: AtomicU64 = AtomicU64::new(0);
        let tmp = self.dir.join(format!(
            "{prefix}-{size_mib}m.img.tmp.{}.{}",
            std::process::id(),
            BUILD.fetch_add(1, Ordering::Relaxed)
        ));
        let mut guard = RemoveOnDrop(Some(tmp.clone()));
        let file = create_new(&tmp)?;
        file.set_len(bytes)
            .map_err(RuntimeError::io(format!("size {}", tmp.display())))?;
        run_mkfs(&tmp, self.kind == Kind::Journaled)?;
        if self.kind == Kind::Overlay {
            lay_out_overlay(&tmp)?;
        }
        if !is_template(&tmp, bytes) {
            return Err(RuntimeError::Unavailable(format!(
                "mkfs.ext4 did not produce an ext4 image of {size_mib} MiB at {}",
                tmp.display()
            )));
        }
        // A template renamed into place before its blocks reach the disk could turn into zeros
        // after a host crash and break every later sandbox of this size.
        file.sync_all()
            .map_err(RuntimeError::io(format!("sync {}", tmp.display())))?;
        std::fs::rename(&tmp, &path)
            .map_err(RuntimeError::io(format!("install {}", path.display())))?;
        guard.0 = None;
        if let Ok(dir) = File::open(&self.dir) {
            let _ = dir.sync_all();
        }
        tracing::debug!(template = %path.display(), "built disk template");
        Ok(path)
    }

    /// Creates `dest` (mode 0600; it must not exist) as a copy of the `size_mib` template and
    /// returns it open for reading and writing. On failure `dest` is gone again.
    pub fn instantiate(&self, size_mib: u64, dest: &Path) -> Result<File, RuntimeError> {
        let template = self.template(size_mib)?;
        let src = File::open(&template)
            .map_err(RuntimeError::io(format!("open {}", template.display())))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dest)
            .map_err(RuntimeError::io(format!("create {}", dest.display())))?;
        // Armed only now: a file that already existed is not ours to delete.
        let mut guard = RemoveOnDrop(Some(dest.to_path_buf()));
        clone_or_copy_sparse(&src, &file, size_bytes(size_mib)?).map_err(RuntimeError::io(
            format!("copy template to {}", dest.display()),
        ))?;
        guard.0 = None;
        Ok(file)
    }
}

/// `size_mib` in bytes, if it is a size templates are made for.
pub fn size_bytes(size_mib: u64) -> Result<u64, RuntimeError> {
    if (MIN_SIZE_MIB..=MAX_SIZE_MIB).contains(&size_mib) {
        Ok(size_mib * MIB)
    } else {
        Err(RuntimeError::InvalidSpec(format!(
            "disk size {size_mib} MiB is outside {MIN_SIZE_MIB}..={MAX_SIZE_MIB} MiB"
        )))
    }
}

/// Makes `dst` (empty) a copy of the first `len` bytes of `src`: a reflink where the
/// filesystem shares extents (btrfs, XFS), else extent by extent so holes stay holes.
pub fn clone_or_copy_sparse(src: &File, dst: &File, len: u64) -> io::Result<()> {
    if src.metadata()?.len() == len && rustix::fs::ioctl_ficlone(dst, src).is_ok() {
        return Ok(());
    }
    dst.set_len(len)?;
    copy_sparse(src, dst, len)
}

fn create_new(path: &Path) -> Result<File, RuntimeError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(RuntimeError::io(format!("create {}", path.display())))
}

/// A usable template has the expected size and an ext4 superblock magic; anything else (a
/// foreign file, damage after a crash) gets rebuilt.
fn is_template(path: &Path, bytes: u64) -> bool {
    const MAGIC_OFFSET: u64 = 1024 + 56;
    let Ok(file) = File::open(path) else {
        return false;
    };
    let Ok(meta) = file.metadata() else {
        return false;
    };
    let mut magic = [0u8; 2];
    meta.is_file()
        && meta.len() == bytes
        && file.read_exact_at(&mut magic, MAGIC_OFFSET).is_ok()
        && u16::from_le_bytes(magic) == 0xEF53
}

fn run_mkfs(image: &Path, journal: bool) -> Result<(), RuntimeError> {
    let mkfs = find_mkfs().ok_or_else(|| {
        RuntimeError::Unavailable("mkfs.ext4 not found (install e2fsprogs)".into())
    })?;
    // No journal for scratch space thrown away with its sandbox. Lazy init and
    // nodiscard keep mkfs from writing (or punching) the whole file. -T default keeps 4 KiB
    // blocks for small sizes too, where mke2fs would otherwise pick 1 KiB "small"/"floppy".
    // root_owner=0:0 whoever runs mkfs: the runtimes hand the root to the sandbox themselves.
    let out = std::process::Command::new(&mkfs)
        .args([
            "-q",
            "-F",
            "-O",
            if journal {
                "has_journal"
            } else {
                "^has_journal"
            },
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0",
            "-m",
            "0",
            "-T",
            "default",
        ])
        .arg(image)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(RuntimeError::io(format!("run {}", mkfs.display())))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(RuntimeError::Unavailable(format!(
        "{} {} failed ({}): {}",
        mkfs.display(),
        image.display(),
        out.status,
        stderr.trim()
    )))
}

/// Edits the unmounted `image` with debugfs (e2fsprogs, like mkfs): no mount, loop device or
/// root needed. debugfs exits 0 whatever its commands do and reports failures on stderr, after
/// its version banner.
fn lay_out_overlay(image: &Path) -> Result<(), RuntimeError> {
    use std::io::Write;
    let debugfs = find_e2fsprogs("debugfs")
        .ok_or_else(|| RuntimeError::Unavailable("debugfs not found (install e2fsprogs)".into()))?;
    let script = format!(
        "rmdir lost+found\nmkdir {OVERLAY_UPPER}\nmkdir {OVERLAY_WORK}\nsif / mode 040711\n\
         sif {OVERLAY_UPPER} mode 040755\nsif {OVERLAY_WORK} mode 040700\n"
    );
    let mut child = std::process::Command::new(&debugfs)
        .args(["-w", "-f", "-"])
        .arg(image)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(RuntimeError::io(format!("run {}", debugfs.display())))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(RuntimeError::io(format!("write to {}", debugfs.display())))?;
    }
    let out = child
        .wait_with_output()
        .map_err(RuntimeError::io(format!("run {}", debugfs.display())))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let complaints: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("debugfs "))
        .collect();
    if out.status.success() && complaints.is_empty() {
        return Ok(());
    }
    Err(RuntimeError::Unavailable(format!(
        "{} {} failed ({}): {}",
        debugfs.display(),
        image.display(),
        out.status,
        complaints.join("; ")
    )))
}

fn find_mkfs() -> Option<PathBuf> {
    find_e2fsprogs("mkfs.ext4")
}

/// The daemon may run with a PATH that lacks the sbin directories.
fn find_e2fsprogs(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Temporary templates left by processes that died mid-build.
fn remove_stale_builds(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some((_, rest)) = name.split_once(".img.tmp.") else {
            continue;
        };
        let Some(pid) = rest.split('.').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        // A running builder (any pid still alive) keeps its file; a recycled pid only delays
        // the clean-up.
        let alive = rustix::process::Pid::from_raw(pid)
            .is_some_and(|p| rustix::process::test_kill_process(p) != Err(Errno::SRCH));
        if !alive {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Copies the first `len` bytes of `src` into `dst` (already sized, all holes) extent by
/// extent, so holes stay holes.
fn copy_sparse(src: &File, dst: &File, len: u64) -> io::Result<()> {
    let mut offset = 0u64;
    while offset < len {
        let start = match rustix::fs::seek(src, SeekFrom::Data(offset)) {
            Ok(start) => start,
            Err(Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = rustix::fs::seek(src, SeekFrom::Hole(start))?.min(len);
        copy_range(src, dst, start, end)?;
        offset = end;
    }
    Ok(())
}

fn copy_range(src: &File, dst: &File, start: u64, end: u64) -> io::Result<()> {
    const CHUNK: u64 = 1 << 30;
    let mut pos = start;
    while pos < end {
        let want = (end - pos).min(CHUNK) as usize;
        let (mut off_in, mut off_out) = (pos, pos);
        match rustix::fs::copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), want) {
            Ok(0) => return Err(short_source()),
            Ok(n) => pos += n as u64,
            // Source and copy on different filesystems, or a filesystem without
            // copy_file_range: copy through userspace.
            Err(Errno::XDEV | Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => {
                return copy_range_buffered(src, dst, pos, end)
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn copy_range_buffered(src: &File, dst: &File, start: u64, end: u64) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = start;
    while pos < end {
        let want = (end - pos).min(buf.len() as u64) as usize;
        let n = src.read_at(&mut buf[..want], pos)?;
        if n == 0 {
            return Err(short_source());
        }
        dst.write_all_at(&buf[..n], pos)?;
        pos += n as u64;
    }
    Ok(())
}

fn short_source() -> io::Error {
    io::Error::new(ErrorKind::UnexpectedEof, "template shorter than its size")
}

/// Deletes a file unless disarmed.
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// 1 MiB of data, a 62 MiB hole, 1 MiB of data.
    fn holey(path: &Path) -> File {
        let f = File::create(path).unwrap();
        f.set_len(64 * MIB).unwrap();
        f.write_all_at(&[0xAB; MIB as usize], 0).unwrap();
        f.write_all_at(&[0xCD; MIB as usize], 63 * MIB).unwrap();
        f.sync_all().unwrap();
        File::open(path).unwrap()
    }

    #[test]
    fn sparse_copy_keeps_holes_and_data() {
        let tmp = tempfile::tempdir().unwrap();
        let src = holey(&tmp.path().join("src"));
        let dst_path = tmp.path().join("dst");
        let dst = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&dst_path)
            .unwrap();
        // Both ways: whatever the filesystem offers, and the extent copy on its own.
        clone_or_copy_sparse(&src, &dst, 64 * MIB).unwrap();
        let other = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(tmp.path().join("dst2"))
            .unwrap();
        other.set_len(64 * MIB).unwrap();
        copy_sparse(&src, &other, 64 * MIB).unwrap();
        for copy in [&dst, &other] {
            let meta = copy.metadata().unwrap();
            assert_eq!(meta.len(), 64 * MIB);
            // st_blocks counts 512-byte units: the 2 MiB of data plus a little metadata.
            assert!(
                meta.blocks() * 512 <= 4 * MIB,
                "{} bytes",
                meta.blocks() * 512
            );
            let mut head = [0u8; 4];
            copy.read_exact_at(&mut head, MIB - 4).unwrap();
            assert_eq!(head, [0xAB; 4]);
            copy.read_exact_at(&mut head, 32 * MIB).unwrap();
            assert_eq!(head, [0; 4]);
            copy.read_exact_at(&mut head, 64 * MIB - 4).unwrap();
            assert_eq!(head, [0xCD; 4]);
        }
    }

    #[test]
    fn templates_are_ext4_built_once_and_copied_sparse() {
        if find_mkfs().is_none() {
            eprintln!("skipped: no mkfs.ext4");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let templates = Templates::new(tmp.path().join("t"));
        let template = templates.template(64).unwrap();
        assert!(is_template(&template, 64 * MIB));
        let ino = std::fs::metadata(&template).unwrap().ino();
        assert_eq!(templates.template(64).unwrap(), template);
        assert_eq!(std::fs::metadata(&template).unwrap().ino(), ino, "rebuilt");

        let dest = tmp.path().join("disk.img");
        let disk = templates.instantiate(64, &dest).unwrap();
        assert!(is_template(&dest, 64 * MIB));
        let meta = disk.metadata().unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert!(meta.blocks() * 512 < 16 * MIB, "copy is not sparse");
        // An existing file is refused and left as it was.
        assert!(templates.instantiate(64, &dest).is_err());
        assert!(is_template(&dest, 64 * MIB));
        for bad in [0, MAX_SIZE_MIB + 1] {
            let err = templates
                .instantiate(bad, &tmp.path().join("bad"))
                .unwrap_err();
            assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err}");
        }
    }

    #[test]
    fn overlay_templates_are_laid_out() {
        let Some(debugfs) = find_mkfs().and(find_e2fsprogs("debugfs")) else {
            eprintln!("skipped: no mkfs.ext4 or debugfs");
            return;
        };
        let tmp = tempfile::tempdir().unwrap();
        let overlay = Templates::overlay(tmp.path().join("t"));
        let template = overlay.template(16).unwrap();
        assert!(is_template(&template, 16 * MIB));
        assert_ne!(
            template,
            Templates::new(tmp.path().join("t")).template(16).unwrap()
        );
        let listing = std::process::Command::new(debugfs)
            .args(["-R", "ls -l /"])
            .arg(&template)
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&listing.stdout);
        let mut entries: Vec<(String, String)> = listing
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                Some((f.last()?.to_string(), f.get(1)?.to_string()))
            })
            .collect();
        entries.sort();
        let expected = [
            (".", "40711"),
            ("..", "40711"),
            ("upper", "40755"),
            ("work", "40700"),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(n, m)| (n.to_string(), m.to_string()))
            .collect();
        assert_eq!(entries, expected, "{listing}");
    }
}
