//! The guest kernel: an uncompressed `vmlinux` for direct ELF (PVH) boot, pulled out of a
//! distribution `bzImage`, and the handful of modules the guest loads before it can see its
//! disks and its agent channel.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules the agent loads at boot (Debian's cloud kernel builds virtio, virtio-blk, the
/// virtio console, vsock and overlayfs as modules); their dependencies are added from the
/// modules' own metadata. The agent channel is a virtio-serial port under QEMU (a migratable
/// device: memory snapshots) and vsock under Firecracker.
pub const GUEST_MODULES: &[&str] = &[
    "virtio_mmio",
    "virtio_blk",
    "virtio_console",
    "overlay",
    "vmw_vsock_virtio_transport",
];

/// Modules the agent's egress ruleset needs (NAT redirect to the agent, conntrack state),
/// loaded only in guests of sessions with network access.
pub const EGRESS_MODULES: &[&str] = &["nft_chain_nat", "nft_redir", "nft_ct"];

/// Modules of the virtio-fs client (and FUSE under it), loaded only in guests that mount
/// volumes.
pub const VOLUME_MODULES: &[&str] = &["virtiofs"];

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("no LZ4-compressed kernel found in {0} (only LZ4 bzImages are supported)")]
    NoPayload(String),
    #[error("corrupt LZ4 kernel payload: {0}")]
    Corrupt(String),
    #[error("kernel payload is not an ELF image")]
    NotElf,
    #[error("module {0} not found in {1}")]
    MissingModule(String, String),
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
}

/// Magic of the LZ4 "legacy" frame the kernel's build uses for `CONFIG_KERNEL_LZ4`.
const LZ4_LEGACY_MAGIC: [u8; 4] = [0x02, 0x21, 0x4c, 0x18];
/// Legacy frames carry blocks of at most 8 MiB uncompressed.
const LZ4_LEGACY_BLOCK: usize = 8 << 20;

/// Extracts the ELF kernel from a bzImage compressed with LZ4. Hand-written because the LZ4
/// crates decode the modern frame format only; the legacy frame is just a magic followed by
/// (little-endian u32 size, raw LZ4 block) pairs, which `lz4_flex` decodes.
pub fn extract_vmlinux(bzimage: &[u8]) -> Result<Vec<u8>, KernelError> {
    let start = bzimage
        .windows(4)
        .position(|w| w == LZ4_LEGACY_MAGIC)
        .ok_or_else(|| KernelError::NoPayload("bzImage".into()))?;
    let mut pos = start + 4;
    let mut out = Vec::new();
    let max_block = LZ4_LEGACY_BLOCK + LZ4_LEGACY_BLOCK / 255 + 16;
    while let Some(size) = bzimage.get(pos..pos + 4) {
        let size = u32::from_le_bytes([size[0], size[1], size[2], size[3]]) as usize;
        // The payload ends where the next word is no block size: the kernel appends its
        // uncompressed length (or the image simply ends).
        if size == 0 || size > max_block || pos + 4 + size > bzimage.len() {
            break;
        }
        let block = &bzimage[pos + 4..pos + 4 + size];
        let mut buf = vec![0u8; LZ4_LEGACY_BLOCK];
        let n = lz4_flex::block::decompress_into(block, &mut buf)
            .map_err(|e| KernelError::Corrupt(e.to_string()))?;
        out.extend_from_slice(&buf[..n]);
        pos += 4 + size;
    }
    if !out.starts_with(b"\x7fELF") {
        return Err(KernelError::NotElf);
    }
    Ok(out)
}

/// The `depends=` list from a module's `.modinfo` strings.
fn module_depends(ko: &[u8]) -> Vec<String> {
    ko.split(|b| *b == 0)
        .find_map(|field| field.strip_prefix(b"depends="))
        .map(|deps| {
            String::from_utf8_lossy(deps)
                .split(',')
                .filter(|d| !d.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Finds `wanted` modules and everything they depend on under a kernel's module tree, and
/// returns them in load order (dependencies first) as (module name, file).
pub fn resolve_modules(
    modules_dir: &Path,
    wanted: &[&str],
) -> Result<Vec<(String, PathBuf)>, KernelError> {
    let mut files = BTreeMap::new();
    index_modules(modules_dir, &mut files)?;
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for name in wanted {
        visit(name, &files, modules_dir, &mut seen, &mut order)?;
    }
    Ok(order)
}

fn visit(
    name: &str,
    files: &BTreeMap<String, PathBuf>,
    dir: &Path,
    seen: &mut BTreeSet<String>,
    order: &mut Vec<(String, PathBuf)>,
) -> Result<(), KernelError> {
    if !seen.insert(name.to_string()) {
        return Ok(());
    }
    let file = files
        .get(name)
        .ok_or_else(|| KernelError::MissingModule(name.into(), dir.display().to_string()))?;
    let bytes = std::fs::read(file).map_err(|e| KernelError::Io(file.display().to_string(), e))?;
    for dep in module_depends(&bytes) {
        visit(&dep, files, dir, seen, order)?;
    }
    order.push((name.to_string(), file.clone()));
    Ok(())
}

/// Module names (file stem, `-` and `_` alike as the kernel treats them) → files.
fn index_modules(dir: &Path, out: &mut BTreeMap<String, PathBuf>) -> Result<(), KernelError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| KernelError::Io(dir.display().to_string(), e))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            index_modules(&path, out)?;
        } else if let Some(stem) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".ko"))
        {
            out.insert(stem.replace('-', "_"), path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn legacy_frame(payload: &[u8]) -> Vec<u8> {
        let mut v = b"bzImage setup code".to_vec();
        v.extend_from_slice(&LZ4_LEGACY_MAGIC);
        for chunk in payload.chunks(LZ4_LEGACY_BLOCK) {
            let block = lz4_flex::block::compress(chunk);
            v.extend_from_slice(&(block.len() as u32).to_le_bytes());
            v.extend_from_slice(&block);
        }
        // What the kernel build appends: the uncompressed size, which is no block size.
        v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        v.extend_from_slice(b"trailing");
        v
    }

    #[test]
    fn extracts_multi_block_elf() {
        let mut payload = b"\x7fELF".to_vec();
        payload.extend((0..(LZ4_LEGACY_BLOCK + 1000)).map(|i| (i % 251) as u8));
        assert_eq!(extract_vmlinux(&legacy_frame(&payload)).unwrap(), payload);
    }

    #[test]
    fn rejects_non_elf_and_missing_payloads() {
        assert!(matches!(
            extract_vmlinux(&legacy_frame(b"not an elf at all")),
            Err(KernelError::NotElf)
        ));
        assert!(matches!(
            extract_vmlinux(b"no magic here"),
            Err(KernelError::NoPayload(_))
        ));
        let mut corrupt = legacy_frame(b"\x7fELF-----------------------------------");
        let at = corrupt
            .windows(4)
            .position(|w| w == LZ4_LEGACY_MAGIC)
            .unwrap()
            + 8;
        corrupt[at] = 0xff;
        corrupt[at + 1] = 0xff;
        assert!(extract_vmlinux(&corrupt).is_err());
    }

    #[test]
    fn module_order_puts_dependencies_first() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("kernel/drivers");
        std::fs::create_dir_all(&sub).unwrap();
        let module = |name: &str, deps: &str| {
            let mut b = b"\x7fELF junk\0license=GPL\0".to_vec();
            b.extend_from_slice(format!("depends={deps}\0name={name}\0").as_bytes());
            std::fs::write(sub.join(format!("{name}.ko")), b).unwrap();
        };
        module("virtio_ring", "");
        module("virtio", "virtio_ring");
        module("virtio_blk", "virtio,virtio_ring");
        module("vsock", "");
        let order = resolve_modules(dir.path(), &["virtio_blk", "vsock"]).unwrap();
        let names: Vec<_> = order.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["virtio_ring", "virtio", "virtio_blk", "vsock"]);
        assert!(matches!(
            resolve_modules(dir.path(), &["nope"]),
            Err(KernelError::MissingModule(..))
        ));
    }
}
