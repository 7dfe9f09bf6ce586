//! The `btrfs` tool, shelled out to: no maintained crate drives subvolumes and qgroups without
//! the C libbtrfsutil, and the tool is what every btrfs host has.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::VolumeError;

pub const SUPER_MAGIC: u64 = 0x9123_683E;

pub fn subvolume_create(path: &Path) -> Result<(), VolumeError> {
    run(&["subvolume", "create"], &[path]).map(drop)
}

pub fn subvolume_snapshot(src: &Path, dst: &Path) -> Result<(), VolumeError> {
    run(&["subvolume", "snapshot"], &[src, dst]).map(drop)
}

pub fn subvolume_delete(path: &Path) -> Result<(), VolumeError> {
    run(&["subvolume", "delete"], &[path]).map(drop)
}

/// Idempotent: the kernel answers at once when quotas are on already.
pub fn quota_enable(path: &Path) -> Result<(), VolumeError> {
    run(&["quota", "enable"], &[path]).map(drop)
}

pub fn qgroup_limit(bytes: u64, path: &Path) -> Result<(), VolumeError> {
    run(&["qgroup", "limit", &bytes.to_string()], &[path]).map(drop)
}

/// Best effort after deletions: qgroups of deleted subvolumes otherwise linger.
pub fn qgroup_clear_stale(path: &Path) {
    if let Err(e) = run(&["qgroup", "clear-stale"], &[path]) {
        tracing::debug!(error = %e, "btrfs qgroup clear-stale");
    }
}

/// `(referenced bytes, referenced limit)` of the subvolume at `path`.
pub fn qgroup_usage(path: &Path) -> Result<(u64, Option<u64>), VolumeError> {
    let rootid = run(&["inspect-internal", "rootid"], &[path])?;
    let qgroup = format!("0/{}", rootid.trim());
    let table = run(&["qgroup", "show", "--raw", "-re"], &[path])?;
    let row = table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cols| cols.first() == Some(&qgroup.as_str()))
        .ok_or_else(|| unexpected(format!("no qgroup {qgroup} for {}", path.display())))?;
    // qgroupid, referenced, exclusive, max referenced, max exclusive[, path]
    let number = |i: usize| row.get(i).and_then(|c| c.parse::<u64>().ok());
    let used = number(1).ok_or_else(|| unexpected(format!("qgroup row {row:?}")))?;
    Ok((used, number(3)))
}

fn unexpected(what: String) -> VolumeError {
    VolumeError::Io {
        context: "btrfs".into(),
        source: std::io::Error::other(what),
    }
}

fn run(args: &[&str], paths: &[&Path]) -> Result<String, VolumeError> {
    let tool = find_tool()
        .ok_or_else(|| VolumeError::Unavailable("btrfs not found (install btrfs-progs)".into()))?;
    let out = Command::new(&tool)
        .args(args)
        .args(paths)
        .stdin(Stdio::null())
        .output()
        .map_err(VolumeError::host(format!("run {}", tool.display())))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    Err(unexpected(format!(
        "btrfs {} {:?} failed ({}): {}",
        args.join(" "),
        paths,
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// The daemon may run with a PATH that lacks the sbin directories.
pub fn find_tool() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/sbin", "/bin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join("btrfs"))
        .find(|p| p.is_file())
}
