//! The host side of volumes: named, persistent directories that sessions mount.
//!
//! [`VolumeHost`] keeps them under one directory (0700), with one of two backends chosen by
//! what that directory sits on: a btrfs subvolume per volume with a qgroup limit
//! ([`Backend::Btrfs`]), or a sparse ext4 image per volume, loop-mounted on the host while in use
//! ([`Backend::Ext4Image`]). Either way the size is a quota: writes past it fail with `ENOSPC`
//! (`EDQUOT` on btrfs). [`fs`] is the file API on a volume's root for callers without a session.
//!
//! The API is synchronous (mounts, mkfs, `btrfs`): async callers run it on a blocking thread.
//! See `notes/volumes-contract.md` of the design for the ownership model (neutral uids).

mod btrfs;
mod error;
pub mod fs;
mod host;

pub use error::VolumeError;
pub use host::{Attachment, VolumeHost};

/// How volumes are stored on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// One subvolume per volume, its size a qgroup limit on referenced bytes.
    Btrfs,
    /// One sparse ext4 image per volume, mounted through a loop device.
    Ext4Image,
}

/// Space of one volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub used_bytes: u64,
    pub size_bytes: u64,
}

/// Longest volume id.
pub const MAX_ID_LEN: usize = 64;

/// Checks a volume id (`[A-Za-z0-9-]{1,64}`): the only thing ever joined into a host path.
pub fn validate_id(id: &str) -> Result<(), VolumeError> {
    let ok = (1..=MAX_ID_LEN).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(VolumeError::InvalidId(id.chars().take(80).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        for good in ["a", "Vol-1", &"x".repeat(64)] {
            validate_id(good).unwrap();
        }
        for bad in ["", "a/b", "..", "a.b", "a b", "é", &"x".repeat(65), "a\0"] {
            assert!(
                matches!(validate_id(bad), Err(VolumeError::InvalidId(_))),
                "{bad:?}"
            );
        }
    }
}
