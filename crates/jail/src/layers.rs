//! A sandbox made from a snapshot: its captured layers applied onto the fresh upper layer
//! before the agent starts, owners shifted into this sandbox's uid range. The layers were made
//! by sandboxes, so every entry is hostile; `koder-layer` never writes outside the upper dir,
//! and a failed apply fails the create (whose cleanup removes the whole sandbox dir).

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use koder_layer::{ApplyOptions, Limits, Owners};
use koder_runtime::RuntimeError;
use rustix::fs::{Mode, OFlags};

use crate::spawn::IdMap;

/// Entries one restored sandbox may hold (a million empty files is a hostile layer, not a
/// workspace).
const MAX_ENTRIES: u64 = 500_000;
/// Bytes of file content when the sandbox has no disk quota to bound them.
const MAX_BYTES_WITHOUT_DISK: u64 = 16 << 30;

pub fn apply(
    upper: &Path,
    layers: &[PathBuf],
    ids: IdMap,
    disk_mib: Option<u64>,
) -> Result<(), RuntimeError> {
    let root = rustix::fs::open(
        upper,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| RuntimeError::io("open upper layer")(e.into()))?;
    let opts = ApplyOptions {
        limits: Limits {
            max_bytes: disk_mib.map_or(MAX_BYTES_WITHOUT_DISK, |m| m.saturating_mul(1 << 20)),
            max_entries: MAX_ENTRIES,
        },
        owners: Owners::Shift {
            base: ids.host_base,
            size: ids.count,
        },
    };
    for layer in layers {
        let file = File::open(layer)
            .map_err(RuntimeError::io(format!("open layer {}", layer.display())))?;
        koder_layer::apply(
            std::os::fd::AsFd::as_fd(&root),
            BufReader::with_capacity(256 * 1024, file),
            &opts,
        )
        .map_err(|e| {
            if e.is_quota() {
                RuntimeError::Exhausted(format!("restoring layer: {e}"))
            } else {
                RuntimeError::Start(format!("restoring layer: {e}"))
            }
        })?;
    }
    Ok(())
}
