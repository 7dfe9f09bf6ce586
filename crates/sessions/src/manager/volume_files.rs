//! The file API of a volume without a session: the daemon reads and writes the volume on the
//! host through `koder_volumes::fs`, which resolves every path inside the volume (its contents
//! were written by sandboxes: hostile). Owners are sandbox ids (0 = root, 1000 = user).

use bytes::Bytes;
use futures::{Stream, StreamExt};
use koder_api_types::{EntryType, FileEntry};
use koder_auth::Identity;
use koder_volumes::fs::{self as vfs, Entry, Kind};
use koder_volumes::Attachment;
use tokio::io::AsyncWriteExt;

use super::volumes::time;
use super::{Manager, SANDBOX_USER_ID};
use crate::Error;

/// Deepest listing asked for at once.
const MAX_DEPTH: u32 = 32;

/// An entry of a volume: a session file entry plus the times E2B's volume API reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeEntry {
    pub entry: FileEntry,
    pub accessed_at: chrono::DateTime<chrono::Utc>,
    pub changed_at: chrono::DateTime<chrono::Utc>,
}

/// Owner and permission bits of something created or changed; unset owners default to the
/// sandbox's `user` (what its processes run as), unset modes to 0644 / 0755.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeMeta {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mode: Option<u32>,
}

impl VolumeMeta {
    fn owner(&self) -> (u32, u32) {
        (
            self.uid.unwrap_or(SANDBOX_USER_ID),
            self.gid.or(self.uid).unwrap_or(SANDBOX_USER_ID),
        )
    }
}

/// A file being downloaded; the volume stays attached while it is read.
pub struct VolumeFile {
    pub size: u64,
    file: tokio::fs::File,
    attachment: Attachment,
}

impl VolumeFile {
    /// The file's bytes as a response body streams them.
    pub fn into_stream(self) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static {
        let attachment = self.attachment;
        tokio_util::io::ReaderStream::new(self.file).map(move |chunk| {
            let _attached = &attachment;
            chunk
        })
    }
}

impl Manager {
    /// Runs `f` on the volume `key`'s root (attached for the call).
    async fn on_volume<T, F>(&self, who: &Identity, key: &str, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&Attachment) -> Result<T, koder_volumes::VolumeError> + Send + 'static,
    {
        let id = self.volume_record(who, key).await?.id;
        self.volumes()?
            .run(move |h| {
                let a = h.attach(&id)?;
                f(&a)
            })
            .await
    }

    pub async fn volume_stat(
        &self,
        who: &Identity,
        key: &str,
        path: &str,
    ) -> Result<VolumeEntry, Error> {
        let path = path.to_string();
        let e = self
            .on_volume(who, key, move |a| vfs::stat(a.root(), &path))
            .await?;
        Ok(volume_entry(e))
    }

    pub async fn volume_list(
        &self,
        who: &Identity,
        key: &str,
        path: &str,
        depth: u32,
    ) -> Result<Vec<VolumeEntry>, Error> {
        if depth == 0 || depth > MAX_DEPTH {
            return Err(Error::InvalidArgument(format!(
                "depth must be 1..={MAX_DEPTH}"
            )));
        }
        let path = path.to_string();
        let entries = self
            .on_volume(who, key, move |a| vfs::list(a.root(), &path, depth))
            .await?;
        Ok(entries.into_iter().map(volume_entry).collect())
    }

    pub async fn volume_make_dir(
        &self,
        who: &Identity,
        key: &str,
        path: &str,
        parents: bool,
        meta: VolumeMeta,
    ) -> Result<VolumeEntry, Error> {
        let path = path.to_string();
        let e = self
            .on_volume(who, key, move |a| {
                vfs::make_dir(a.root(), &path, parents, Some(meta.owner()), meta.mode)
            })
            .await?;
        Ok(volume_entry(e))
    }

    /// Writes `body` to a file (replacing one only with `overwrite`, atomically); a failed
    /// upload leaves no file behind.
    #[allow(clippy::too_many_arguments)]
    pub async fn volume_upload<S, E>(
        &self,
        who: &Identity,
        key: &str,
        path: &str,
        overwrite: bool,
        meta: VolumeMeta,
        declared_len: Option<u64>,
        mut body: S,
    ) -> Result<VolumeEntry, Error>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let max = self.cfg.max_file_bytes;
        if declared_len.is_some_and(|n| n > max) {
            return Err(Error::PayloadTooLarge(format!(
                "files are limited to {max} bytes"
            )));
        }
        let id = self.volume_record(who, key).await?.id;
        let volumes = self.volumes()?;
        let p = path.to_string();
        let (attachment, new) = volumes
            .run(move |h| {
                let a = h.attach(&id)?;
                let f = vfs::create_file(a.root(), &p, overwrite, Some(meta.owner()), meta.mode)?;
                Ok((a, f))
            })
            .await?;
        let writer = new
            .file()
            .try_clone()
            .map_err(|e| Error::Internal(format!("volume upload: {e}")))?;
        // Until it is committed the file has no name: a failed or dropped upload leaves nothing.
        copy_body(tokio::fs::File::from_std(writer), &mut body, max).await?;
        let e = volumes
            .run(move |_| {
                let _attached = attachment;
                new.commit()
            })
            .await?;
        Ok(volume_entry(e))
    }

    pub async fn volume_download(
        &self,
        who: &Identity,
        key: &str,
        path: &str,
    ) -> Result<VolumeFile, Error> {
        let path = path.to_string();
        let id = self.volume_record(who, key).await?.id;
        let (attachment, file, size) = self
            .volumes()?
            .run(move |h| {
                let a = h.attach(&id)?;
                let (f, size) = vfs::open_file(a.root(), &path)?;
                Ok((a, f, size))
            })
            .await?;
        Ok(VolumeFile {
            file: tokio::fs::File::from_std(file),
            size,
            attachment,
        })
    }

    /// Removes a file, a symlink or a whole directory tree.
    pub async fn volume_remove(&self, who: &Identity, key: &str, path: &str) -> Result<(), Error> {
        let path = path.to_string();
        self.on_volume(who, key, move |a| vfs::remove(a.root(), &path))
            .await
    }

    /// Changes owner and mode; what `meta` leaves unset stays.
    pub async fn volume_set_metadata(
        &self,
        who: &Identity,
        key: &str,
        path: &str,
        meta: VolumeMeta,
    ) -> Result<VolumeEntry, Error> {
        let path = path.to_string();
        let e = self
            .on_volume(who, key, move |a| {
                vfs::set_metadata(a.root(), &path, meta.uid, meta.gid, meta.mode)
            })
            .await?;
        Ok(volume_entry(e))
    }
}

async fn copy_body<S, E>(mut file: tokio::fs::File, body: &mut S, max: u64) -> Result<(), Error>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut total = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Error::InvalidArgument(format!("upload body: {e}")))?;
        total += chunk.len() as u64;
        if total > max {
            return Err(Error::PayloadTooLarge(format!(
                "files are limited to {max} bytes"
            )));
        }
        file.write_all(&chunk).await.map_err(write_error)?;
    }
    file.flush().await.map_err(write_error)
}

/// `ENOSPC` (an ext4 image full) and `EDQUOT` (a btrfs qgroup limit) both mean the volume's
/// size quota is reached.
fn write_error(e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
            Error::FsQuotaExceeded("the volume is full (its size quota is reached)".into())
        }
        _ => Error::Internal(format!("writing to the volume: {e}")),
    }
}

fn volume_entry(e: Entry) -> VolumeEntry {
    VolumeEntry {
        entry: FileEntry {
            name: e.name,
            path: e.path,
            kind: match e.kind {
                Kind::File => EntryType::File,
                Kind::Directory => EntryType::Dir,
                Kind::Symlink => EntryType::Symlink,
                Kind::Unknown => EntryType::Other,
            },
            size: e.size,
            mode: e.mode,
            modified_at: time(e.mtime),
            symlink_target: e.target,
            uid: e.uid,
            gid: e.gid,
            metadata: Default::default(),
        },
        accessed_at: time(e.atime),
        changed_at: time(e.ctime),
    }
}
