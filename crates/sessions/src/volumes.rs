//! Volumes on this host as the manager uses them: `koder-volumes` calls moved off the async
//! workers (they mount, mkfs and walk directories), their errors in API terms, and the rules
//! for names and mount requests that hold before anything touches the disk.

use std::path::Path;
use std::sync::Arc;

use koder_api_types::{ErrorCode, VolumeMountRequest};
use koder_volumes::{VolumeError, VolumeHost};

use crate::Error;

/// Most volumes one session mounts.
pub const MAX_MOUNTS: usize = 16;
const MAX_NAME_LEN: usize = 128;
/// Smallest volume: room for an ext4 journal and a few files.
pub const MIN_SIZE_MIB: u64 = 16;

/// This host's volumes.
pub(crate) struct Volumes {
    host: Arc<VolumeHost>,
}

impl Volumes {
    pub(crate) async fn open(dir: &Path, templates: &Path) -> Result<Self, Error> {
        let (dir, templates) = (dir.to_path_buf(), templates.to_path_buf());
        let host = blocking(move || VolumeHost::open(&dir, &templates)).await?;
        Ok(Self {
            host: Arc::new(host),
        })
    }

    /// Runs `f` on the host's volumes on a blocking thread.
    pub(crate) async fn run<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&VolumeHost) -> Result<T, VolumeError> + Send + 'static,
    {
        let host = self.host.clone();
        blocking(move || f(&host)).await
    }

    pub(crate) fn backend_name(&self) -> &'static str {
        match self.host.backend() {
            koder_volumes::Backend::Btrfs => "btrfs",
            koder_volumes::Backend::Ext4Image => "ext4",
        }
    }
}

async fn blocking<T, F>(f: F) -> Result<T, Error>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, VolumeError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("volume task: {e}")))?
        .map_err(Error::from)
}

impl From<VolumeError> for Error {
    fn from(e: VolumeError) -> Self {
        let msg = e.to_string();
        match e.code() {
            ErrorCode::NotFound => Error::FileNotFound(msg),
            ErrorCode::InvalidArgument => Error::InvalidArgument(msg),
            ErrorCode::Conflict => Error::Conflict(msg),
            ErrorCode::VolumeBusy => Error::VolumeBusy(msg),
            ErrorCode::PermissionDenied => Error::PermissionDenied(msg),
            ErrorCode::FsQuotaExceeded => Error::FsQuotaExceeded(msg),
            ErrorCode::PayloadTooLarge => Error::PayloadTooLarge(msg),
            ErrorCode::NotImplemented | ErrorCode::RuntimeUnavailable => Error::NotImplemented(msg),
            _ => Error::Internal(format!("volume: {msg}")),
        }
    }
}

/// 1–128 characters of `[A-Za-z0-9._-]`, and not shaped like an id (ids and names share the
/// path segment of the volume routes).
pub(crate) fn validate_name(name: &str) -> Result<(), Error> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if name.is_empty() || name.len() > MAX_NAME_LEN || !ok_chars {
        return Err(Error::InvalidArgument(format!(
            "volume name {name:?}: 1-{MAX_NAME_LEN} characters of [A-Za-z0-9._-]"
        )));
    }
    if uuid::Uuid::parse_str(name).is_ok() {
        return Err(Error::InvalidArgument(format!(
            "volume name {name:?} looks like a volume id; pick another"
        )));
    }
    Ok(())
}

/// Count, targets (absolute, clean, outside `/proc`, `/sys`, `/dev`), no two at or under one
/// another, no volume twice.
pub(crate) fn validate_mounts(mounts: &[VolumeMountRequest]) -> Result<(), Error> {
    if mounts.len() > MAX_MOUNTS {
        return Err(Error::InvalidArgument(format!(
            "at most {MAX_MOUNTS} volumes per session"
        )));
    }
    for m in mounts {
        koder_agent_protocol::check_mount_target(&m.path)
            .map_err(|e| Error::InvalidArgument(format!("volume {:?}: {e}", m.name)))?;
    }
    let targets: Vec<&str> = mounts.iter().map(|m| m.path.as_str()).collect();
    koder_agent_protocol::check_mount_targets(&targets)
        .map_err(|e| Error::InvalidArgument(format!("volume paths: {e}")))?;
    for (i, m) in mounts.iter().enumerate() {
        if mounts[..i].iter().any(|o| o.name == m.name) {
            return Err(Error::InvalidArgument(format!(
                "volume {:?} is asked for twice",
                m.name
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(name: &str, path: &str) -> VolumeMountRequest {
        VolumeMountRequest {
            name: name.into(),
            path: path.into(),
            read_only: false,
        }
    }

    #[test]
    fn names_are_short_plain_and_not_ids() {
        assert!(validate_name("data-1.v_2").is_ok());
        for bad in ["", "a/b", "..x/", "naïve", "a b", &"x".repeat(129)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_name("0f8fad5b-d9cb-469f-a165-70867728950e").is_err());
    }

    #[test]
    fn mounts_are_distinct_clean_and_few() {
        assert!(validate_mounts(&[mount("a", "/data"), mount("b", "/work/b")]).is_ok());
        assert!(validate_mounts(&[mount("a", "/proc/x")]).is_err());
        assert!(validate_mounts(&[mount("a", "/data"), mount("b", "/data/x")]).is_err());
        assert!(validate_mounts(&[mount("a", "/x"), mount("a", "/y")]).is_err());
        let many: Vec<_> = (0..=MAX_MOUNTS)
            .map(|i| mount(&format!("v{i}"), &format!("/v{i}")))
            .collect();
        assert!(validate_mounts(&many).is_err());
    }
}
