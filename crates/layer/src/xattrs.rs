//! The one extended-attribute policy both ends share, so a capture never records what an
//! apply would refuse.

use std::os::fd::BorrowedFd;

use rustix::fs::XattrFlags;
use rustix::io::Errno;

use crate::LayerError;

/// PAX record prefix GNU tar and bsdtar use for extended attributes.
pub(crate) const PAX_PREFIX: &str = "SCHILY.xattr.";
/// Marks an overlay directory that hides everything below it.
pub(crate) const OPAQUE: &[u8] = b"user.overlay.opaque";
/// Linux' own bounds (`XATTR_SIZE_MAX`, `XATTR_LIST_MAX`).
const MAX_VALUE: usize = 64 * 1024;
const MAX_LIST: usize = 64 * 1024;
pub(crate) const MAX_PER_ENTRY: usize = 64;

pub(crate) type Xattr = (Vec<u8>, Vec<u8>);

/// Whether a layer keeps this attribute: the opaque marker and user attributes outside the
/// overlay's namespace. Everything else (`trusted.*`, `security.*` such as file
/// capabilities, `system.*` ACLs, overlay bookkeeping) is privileged or describes the old
/// layers, and is dropped.
pub(crate) fn kept(name: &[u8]) -> bool {
    name == OPAQUE || (name.starts_with(b"user.") && !name.starts_with(b"user.overlay."))
}

/// Checks one attribute against the bounds; `Ok(false)` for one the policy drops.
pub(crate) fn admit(path: &[u8], name: &[u8], value: &[u8]) -> Result<bool, LayerError> {
    if !kept(name) {
        return Ok(false);
    }
    if name.contains(&0) || name.len() > crate::MAX_NAME {
        return Err(LayerError::forbidden(path, "malformed xattr name"));
    }
    if value.len() > MAX_VALUE {
        return Err(LayerError::forbidden(path, "xattr value over 64 KiB"));
    }
    Ok(true)
}

/// The kept attributes of an open file or directory, sorted by name.
pub(crate) fn read(fd: BorrowedFd<'_>, path: &[u8]) -> Result<Vec<Xattr>, LayerError> {
    let mut list = vec![0u8; MAX_LIST];
    let len = match rustix::fs::flistxattr(fd, &mut list[..]) {
        Ok(len) => len,
        Err(Errno::NOTSUP) => return Ok(Vec::new()),
        Err(e) => {
            return Err(LayerError::io(
                format!("listing xattrs of {}", crate::shown(path)),
                e,
            ))
        }
    };
    let mut names: Vec<&[u8]> = list[..len]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty() && kept(n))
        .collect();
    names.sort_unstable();
    if names.len() > MAX_PER_ENTRY {
        return Err(LayerError::forbidden(path, "more than 64 xattrs"));
    }
    let mut value = vec![0u8; MAX_VALUE];
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        match rustix::fs::fgetxattr(fd, name, &mut value[..]) {
            Ok(n) => out.push((name.to_vec(), value[..n].to_vec())),
            // Removed between list and get: the tree was not frozen; nothing to record.
            Err(Errno::NODATA) => {}
            Err(e) => {
                return Err(LayerError::io(
                    format!("reading xattr of {}", crate::shown(path)),
                    e,
                ))
            }
        }
    }
    Ok(out)
}

/// Sets `wanted` on a fresh inode.
pub(crate) fn set(fd: BorrowedFd<'_>, path: &[u8], wanted: &[Xattr]) -> Result<(), LayerError> {
    for (name, value) in wanted {
        rustix::fs::fsetxattr(fd, name.as_slice(), value, XattrFlags::empty())
            .map_err(|e| LayerError::io(format!("setting xattr on {}", crate::shown(path)), e))?;
    }
    Ok(())
}

/// Makes the kept attributes of an existing directory exactly `wanted`, except that an opaque
/// marker already there stays: a directory opaque in a lower layer of the stack still hides
/// what is below that layer.
pub(crate) fn replace(fd: BorrowedFd<'_>, path: &[u8], wanted: &[Xattr]) -> Result<(), LayerError> {
    for (name, _) in read(fd, path)? {
        if name != OPAQUE && !wanted.iter().any(|(n, _)| *n == name) {
            rustix::fs::fremovexattr(fd, name.as_slice()).map_err(|e| {
                LayerError::io(format!("removing xattr of {}", crate::shown(path)), e)
            })?;
        }
    }
    set(fd, path, wanted)
}
