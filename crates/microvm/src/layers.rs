//! A microVM made from a snapshot: its captured layers (tar files in the daemon's layer cache,
//! which the unprivileged VMM cannot open) are laid end to end on one read-only raw disk in the
//! VM's own directory; the guest agent applies them onto its empty upper directory before it
//! mounts the overlay (see `VmLayers`). One disk whatever the stack's height: QEMU's `microvm`
//! machine has few virtio-mmio slots, and the root, scratch and vsock devices hold three.

use std::fs::File;
use std::path::{Path, PathBuf};

use koder_runtime::RuntimeError;

/// Highest stack a VM starts from: every layer is read by the guest at boot, and each sits in
/// the guest config.
pub const MAX_LAYERS: usize = 64;
/// The disk's file name in the VM directory.
pub const DISK_FILE: &str = "layers.img";
const SECTOR: u64 = 512;

/// Writes `layers` end to end into a new file `dest` and returns each one's length. The file
/// is padded to whole sectors (a block device has no partial one); the guest reads each layer
/// at the sum of the lengths before it.
pub fn stack(layers: &[PathBuf], dest: &Path) -> Result<Vec<u64>, RuntimeError> {
    if layers.len() > MAX_LAYERS {
        return Err(RuntimeError::InvalidSpec(format!(
            "a microVM starts from at most {MAX_LAYERS} layers, this snapshot has {}",
            layers.len()
        )));
    }
    let mut out = File::create(dest).map_err(RuntimeError::io(format!(
        "create layers disk {}",
        dest.display()
    )))?;
    let mut sizes = Vec::with_capacity(layers.len());
    for layer in layers {
        let mut input = File::open(layer)
            .map_err(RuntimeError::io(format!("open layer {}", layer.display())))?;
        // File to file: copy_file_range, so a reflinking filesystem shares the extents.
        let copied = std::io::copy(&mut input, &mut out)
            .map_err(RuntimeError::io(format!("copy layer {}", layer.display())))?;
        sizes.push(copied);
    }
    let total: u64 = sizes.iter().sum();
    out.set_len(total.div_ceil(SECTOR) * SECTOR)
        .map_err(RuntimeError::io("pad the layers disk"))?;
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_lie_end_to_end_on_whole_sectors() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.tar");
        let b = dir.path().join("b.tar");
        std::fs::write(&a, vec![1u8; 1024]).unwrap();
        std::fs::write(&b, vec![2u8; 700]).unwrap();
        let disk = dir.path().join(DISK_FILE);
        assert_eq!(stack(&[a, b], &disk).unwrap(), [1024, 700]);
        let bytes = std::fs::read(&disk).unwrap();
        assert_eq!(bytes.len(), 2048);
        assert!(bytes[..1024].iter().all(|b| *b == 1));
        assert!(bytes[1024..1724].iter().all(|b| *b == 2));
        assert!(bytes[1724..].iter().all(|b| *b == 0));
    }

    #[test]
    fn a_missing_layer_or_too_high_a_stack_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join(DISK_FILE);
        let err = stack(&[dir.path().join("gone.tar")], &disk).unwrap_err();
        assert!(err.to_string().contains("gone.tar"), "{err}");
        let many = vec![dir.path().join("x.tar"); MAX_LAYERS + 1];
        let err = stack(&many, &disk).unwrap_err();
        assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err:?}");
    }
}
