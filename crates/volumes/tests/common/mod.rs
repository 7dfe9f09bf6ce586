//! Set-up shared by the backend tests: root checks and a guard that unmounts whatever a test
//! left mounted under its directory, on success or panic, so loop devices clear themselves.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::Write;
use std::path::{Path, PathBuf};

use koder_volumes::{fs, VolumeError};

pub fn can_loop_mount() -> bool {
    let ok = rustix::process::geteuid().is_root()
        && Path::new("/dev/loop-control").exists()
        && tool("mkfs.ext4");
    if !ok {
        eprintln!("skipped: needs root, loop devices and mkfs.ext4");
    }
    ok
}

pub fn tool(name: &str) -> bool {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .any(|d| Path::new(d).join(name).is_file())
}

/// A temporary directory whose mounts are all lazily unmounted on drop, deepest first.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Self {
        Scratch {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn mounts(&self) -> Vec<PathBuf> {
        mounts_under(self.path())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for _ in 0..8 {
            let mut mounts = mounts_under(self.path());
            if mounts.is_empty() {
                break;
            }
            mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
            for m in mounts {
                let _ = rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
}

/// Mount points at or below `dir`, one per stacked mount, from this namespace's mountinfo.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|m| m.starts_with(dir))
        .collect()
}

pub fn write(root: &Path, path: &str, data: &[u8]) -> Result<fs::Entry, VolumeError> {
    let mut file = fs::create_file(root, path, true, Some((1000, 1000)), None)?;
    file.file_mut()
        .write_all(data)
        .map_err(|e| VolumeError::io(path, e))?;
    file.commit()
}
