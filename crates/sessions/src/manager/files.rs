//! The files phase: upload, download, list, remove, mkdir and move inside a session's sandbox.
//! Paths get cheap checks here; the agent resolves each one inside the sandbox root.

use bytes::Bytes;
use chrono::DateTime;
use futures::{Stream, StreamExt};
use koder_agent_protocol::{self as proto, Entry, EntryKind, FileReader};
use koder_api_types::{EntryType, FileEntry, FileList};
use koder_auth::Identity;

use super::account::owner;
use super::Manager;
use crate::Error;

impl Manager {
    /// Writes a file atomically from `body`, creating missing parents. What it creates belongs
    /// to `user`'s account (`root` when `None`); a replaced file keeps its owner.
    pub async fn upload<S, E>(
        &self,
        who: &Identity,
        id: &str,
        path: &str,
        declared_len: Option<u64>,
        body: S,
        user: Option<&str>,
    ) -> Result<FileEntry, Error>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        self.upload_with_metadata(who, id, path, declared_len, body, user, Vec::new())
            .await
    }

    /// [`upload`](Self::upload) that stores `metadata` on the new file (as `user.e2b.*`
    /// extended attributes, see `koder_agent_protocol::metadata`); whatever metadata the file
    /// it replaces had is gone. Metadata the rules refuse → `InvalidArgument`, nothing written.
    #[allow(clippy::too_many_arguments)]
    pub async fn upload_with_metadata<S, E>(
        &self,
        who: &Identity,
        id: &str,
        path: &str,
        declared_len: Option<u64>,
        mut body: S,
        user: Option<&str>,
        metadata: Vec<(String, String)>,
    ) -> Result<FileEntry, Error>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        proto::metadata::check_metadata(&metadata)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let live = self.awake(who, id).await?;
        let max = self.cfg.max_file_bytes;
        if declared_len.is_some_and(|n| n > max) {
            return Err(Error::PayloadTooLarge(format!(
                "files are limited to {max} bytes"
            )));
        }
        validate_path(path)?;
        let owner = owner(&self.account_in(id, &live, user).await?);
        let agent = live.sandbox.agent();
        let mut writer = match agent
            .write_file(proto::WriteFileRequest {
                path: path.into(),
                mode: None,
                create_parents: true,
                max_bytes: Some(max),
                owner,
                metadata,
            })
            .await
        {
            Ok(w) => w,
            Err(e) => return Err(self.agent_failed(id, e).await),
        };
        while let Some(chunk) = body.next().await {
            // Dropping `writer` on any early return discards the partial upload in the sandbox.
            let chunk = chunk.map_err(|e| Error::InvalidArgument(format!("upload body: {e}")))?;
            if let Err(e) = writer.write(&chunk).await {
                return Err(self.agent_failed(id, e).await);
            }
        }
        match writer.finish().await {
            Ok(entry) => Ok(file_entry(entry)),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }

    /// Opens a file for a streaming download.
    pub async fn download(
        &self,
        who: &Identity,
        id: &str,
        path: &str,
    ) -> Result<FileReader, Error> {
        let live = self.awake(who, id).await?;
        validate_path(path)?;
        match live.sandbox.agent().open_read(path, u64::MAX).await {
            Ok(r) => Ok(r),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }

    pub async fn list_files(
        &self,
        who: &Identity,
        id: &str,
        path: &str,
        depth: u32,
    ) -> Result<FileList, Error> {
        let live = self.awake(who, id).await?;
        validate_path(path)?;
        if depth == 0 || depth > 32 {
            return Err(Error::InvalidArgument("depth must be 1..=32".into()));
        }
        match live.sandbox.agent().list(path, depth).await {
            Ok((entries, truncated)) => Ok(FileList {
                entries: entries.into_iter().map(file_entry).collect(),
                truncated,
            }),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }

    /// The entry of `path` itself (a symlink is described, not followed).
    pub async fn stat_file(
        &self,
        who: &Identity,
        id: &str,
        path: &str,
    ) -> Result<FileEntry, Error> {
        let live = self.awake(who, id).await?;
        validate_path(path)?;
        match live.sandbox.agent().stat(path).await {
            Ok(e) => Ok(file_entry(e)),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }

    pub async fn remove_file(
        &self,
        who: &Identity,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<(), Error> {
        let live = self.awake(who, id).await?;
        validate_path(path)?;
        match live.sandbox.agent().remove(path, recursive).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }

    /// `mkdir -p`; what it creates belongs to `user`'s account (`root` when `None`).
    pub async fn make_dir(
        &self,
        who: &Identity,
        id: &str,
        path: &str,
        user: Option<&str>,
    ) -> Result<FileEntry, Error> {
        let live = self.awake(who, id).await?;
        validate_path(path)?;
        let owner = owner(&self.account_in(id, &live, user).await?);
        match live.sandbox.agent().make_dir(path, owner).await {
            Ok(e) => Ok(file_entry(e)),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }

    pub async fn move_file(
        &self,
        who: &Identity,
        id: &str,
        from: &str,
        to: &str,
    ) -> Result<FileEntry, Error> {
        let live = self.awake(who, id).await?;
        validate_path(from)?;
        validate_path(to)?;
        match live.sandbox.agent().rename(from, to).await {
            Ok(e) => Ok(file_entry(e)),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }
}

/// Cheap checks before a round trip; the agent resolves (and re-validates) every path in-root.
fn validate_path(path: &str) -> Result<(), Error> {
    if path.is_empty() {
        return Err(Error::InvalidArgument("path is required".into()));
    }
    if path.contains('\0') {
        return Err(Error::InvalidArgument(
            "path must not contain NUL bytes".into(),
        ));
    }
    if path.len() > proto::MAX_PATH_BYTES {
        return Err(Error::InvalidArgument(format!(
            "path longer than {} bytes",
            proto::MAX_PATH_BYTES
        )));
    }
    Ok(())
}

fn file_entry(e: Entry) -> FileEntry {
    FileEntry {
        name: e.name,
        path: e.path,
        kind: match e.kind {
            EntryKind::File => EntryType::File,
            EntryKind::Dir => EntryType::Dir,
            EntryKind::Symlink => EntryType::Symlink,
            EntryKind::Other => EntryType::Other,
        },
        size: e.size,
        mode: e.mode,
        modified_at: DateTime::from_timestamp_millis(e.modified_ms).unwrap_or_default(),
        symlink_target: e.symlink_target,
        uid: e.uid,
        gid: e.gid,
        metadata: e.metadata.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_path_refuses_empty_nul_and_overlong() {
        assert!(validate_path("/home/user/a.txt").is_ok());
        assert!(validate_path("relative/also/ok").is_ok());
        assert!(validate_path("").is_err());
        assert!(validate_path("a\0b").is_err());
        assert!(validate_path(&"a".repeat(proto::MAX_PATH_BYTES)).is_ok());
        assert!(validate_path(&"a".repeat(proto::MAX_PATH_BYTES + 1)).is_err());
    }

    #[test]
    fn file_entry_carries_kind_time_and_owner() {
        let e = file_entry(Entry {
            name: "l".into(),
            path: "/tmp/l".into(),
            kind: EntryKind::Symlink,
            size: 3,
            mode: 0o777,
            modified_ms: 1_700_000_000_123,
            symlink_target: Some("/etc".into()),
            uid: 1000,
            gid: 1000,
            metadata: vec![("k".into(), "v".into())],
        });
        assert_eq!(e.kind, EntryType::Symlink);
        assert_eq!(e.modified_at.timestamp_millis(), 1_700_000_000_123);
        assert_eq!((e.uid, e.gid, e.size, e.mode), (1000, 1000, 3, 0o777));
        assert_eq!(e.symlink_target.as_deref(), Some("/etc"));
        assert_eq!(e.metadata.get("k").map(String::as_str), Some("v"));
    }
}
