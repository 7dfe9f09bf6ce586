//! The tenant-scoped blob store for snapshots and durable pauses, on `object_store`: a local
//! directory (`<data_dir>/blobs`, mode 0700) by default, an S3-compatible bucket by config.
//!
//! Objects live at `tenants/<tenant>/<key>` under the configured root or prefix. Every tenant
//! and key is validated (see [`Blobs::put`]) before it becomes a path, so no name escapes its
//! tenant. Uploads stream through multipart uploads in 8 MiB parts (never a whole object in
//! memory) and become visible only once complete; reads are checked against the size and
//! sha256 the upload returned.

mod config;
mod error;
mod local;
mod names;
mod upload;
mod verify;
mod writer;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parking_lot::Mutex;

pub use config::BlobConfig;
pub use error::BlobError;
pub use writer::BlobWriter;

use config::Backend;

/// What a completed upload stored; the caller keeps it to check the read-back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlobInfo {
    pub size: u64,
    /// Lowercase hex.
    pub sha256: String,
}

/// A handle on the store; cheap to clone.
#[derive(Clone)]
pub struct Blobs {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn ObjectStore>,
    /// The configured prefix (S3); empty for a local directory, which is its own root.
    prefix: Path,
    local: Option<Local>,
    /// This process's uploads in progress, by object path: `sweep_incomplete` must not take
    /// their staging files.
    uploading: Mutex<HashMap<Path, usize>>,
}

struct Local {
    fs: Arc<LocalFileSystem>,
    root: PathBuf,
}

/// Counts an upload in `uploading` for as long as it lives.
struct Uploading<'a> {
    inner: &'a Inner,
    path: Path,
}

impl<'a> Uploading<'a> {
    fn new(inner: &'a Inner, path: &Path) -> Self {
        *inner.uploading.lock().entry(path.clone()).or_default() += 1;
        Uploading {
            inner,
            path: path.clone(),
        }
    }
}

impl Drop for Uploading<'_> {
    fn drop(&mut self) {
        let mut map = self.inner.uploading.lock();
        if let Some(n) = map.get_mut(&self.path) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.path);
            }
        }
    }
}

impl Blobs {
    /// Opens the store `cfg` names, creating a local directory (mode 0700) if needed. Opening
    /// S3 sends no request: a wrong endpoint or key shows on first use.
    pub async fn open(cfg: &BlobConfig, data_dir: &FsPath) -> Result<Blobs, BlobError> {
        let (cfg, data_dir) = (cfg.clone(), data_dir.to_path_buf());
        let backend = tokio::task::spawn_blocking(move || config::open_backend(&cfg, &data_dir))
            .await
            .map_err(|e| BlobError::io("opening the blob store", std::io::Error::other(e)))??;
        let (store, prefix, local): (Arc<dyn ObjectStore>, _, _) = match backend {
            Backend::Local { fs, root } => (
                Arc::clone(&fs) as _,
                Path::default(),
                Some(Local { fs, root }),
            ),
            Backend::S3 { store, prefix } => (store as _, prefix, None),
        };
        Ok(Blobs {
            inner: Arc::new(Inner {
                store,
                prefix,
                local,
                uploading: Mutex::new(HashMap::new()),
            }),
        })
    }

    fn path(&self, tenant: &str, key: &str) -> Result<Path, BlobError> {
        names::object_path(&self.inner.prefix, tenant, key)
    }

    /// Streams `body` into the object `key` of `tenant`; visible only once complete (never a
    /// half object: an error from `body`, a store error or a dropped future aborts the
    /// upload). Replaces an existing object. Returns size and sha256.
    ///
    /// `tenant`: 1–128 of `[A-Za-z0-9._-]`, not `.`/`..`. `key`: `/`-separated segments of
    /// 1–240 of `[A-Za-z0-9._-]` (filesystem name limits), none `.`/`..`, at most 512 bytes. On a local store a key
    /// cannot be both an object and a "directory" of others (`a` and `a/b`).
    pub async fn put(
        &self,
        tenant: &str,
        key: &str,
        body: impl Stream<Item = Result<Bytes, std::io::Error>> + Send,
    ) -> Result<BlobInfo, BlobError> {
        let path = self.path(tenant, key)?;
        let _uploading = Uploading::new(&self.inner, &path);
        let info = upload::upload(self.inner.store.as_ref(), &path, body).await?;
        if let Some(local) = &self.inner.local {
            let file = local.fs.path_to_filesystem(&path)?;
            let root = local.root.clone();
            blocking("syncing the blob to disk", move || {
                local::sync(&root, &file)
            })
            .await?;
        }
        Ok(info)
    }

    /// [`put`](Self::put) for a synchronous producer: returns a [`BlobWriter`]
    /// (`std::io::Write`) to hand to a blocking thread, and the upload future, which must be
    /// polled at the same time (e.g. `tokio::join!(upload, spawn_blocking(producer))`): the
    /// writer blocks while the upload is not consuming. The producer ends with
    /// [`BlobWriter::finish`]; a writer dropped without it fails the upload, leaving nothing.
    pub fn writer(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<
        (
            BlobWriter,
            impl Future<Output = Result<BlobInfo, BlobError>> + Send + 'static,
        ),
        BlobError,
    > {
        self.path(tenant, key)?;
        let (writer, body) = writer::channel();
        let (this, tenant, key) = (self.clone(), tenant.to_owned(), key.to_owned());
        Ok((writer, async move { this.put(&tenant, &key, body).await }))
    }

    /// Reads the object back as a stream. A stored size other than `expected.size` fails at
    /// once; otherwise the stream yields the content and, if it does not match `expected`
    /// (sha256 or size), ends with [`BlobError::Checksum`]: the caller must then discard
    /// whatever it wrote from the stream.
    pub async fn get(
        &self,
        tenant: &str,
        key: &str,
        expected: &BlobInfo,
    ) -> Result<impl Stream<Item = Result<Bytes, BlobError>> + Send + 'static, BlobError> {
        let path = self.path(tenant, key)?;
        let got = self.inner.store.get(&path).await?;
        if got.meta.size != expected.size {
            return Err(BlobError::Checksum {
                expected: expected.clone(),
                actual_size: got.meta.size,
                actual_sha256: None,
            });
        }
        Ok(verify::verified(got.into_stream(), expected.clone()))
    }

    /// Where a complete object of a local store lies on disk (`None` for S3), for callers that
    /// can share its bytes (a hard link) instead of copying them. The file must be treated as
    /// read-only, and its content checked by the caller if it matters.
    pub fn local_file(&self, tenant: &str, key: &str) -> Result<Option<PathBuf>, BlobError> {
        let path = self.path(tenant, key)?;
        match &self.inner.local {
            Some(local) => Ok(Some(local.fs.path_to_filesystem(&path)?)),
            None => Ok(None),
        }
    }

    /// Deletes the object; a missing one is no error.
    pub async fn delete(&self, tenant: &str, key: &str) -> Result<(), BlobError> {
        let path = self.path(tenant, key)?;
        match self.inner.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The tenant's complete objects, `(key, size)` sorted by key; staging files of uploads
    /// in progress never show.
    pub async fn list(&self, tenant: &str) -> Result<Vec<(String, u64)>, BlobError> {
        let dir = names::tenant_dir(&self.inner.prefix, tenant)?;
        let mut objects = self.inner.store.list(Some(&dir));
        let mut out = Vec::new();
        while let Some(meta) = objects.next().await {
            let meta = meta?;
            // Anything this crate could not have written (a foreign object in a shared
            // bucket) is not the tenant's key.
            if let Some(key) = names::key_in(&dir, &meta.location) {
                out.push((key, meta.size));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Every tenant with a directory in the store, sorted (orphan sweeps after a crash).
    pub async fn list_tenants(&self) -> Result<Vec<String>, BlobError> {
        let dir = self.inner.prefix.clone().join(names::TENANTS);
        let listing = self.inner.store.list_with_delimiter(Some(&dir)).await?;
        let mut out: Vec<String> = listing
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename())
            .filter(|t| names::valid_tenant(t))
            .map(str::to_owned)
            .collect();
        out.sort();
        Ok(out)
    }

    /// Removes what uploads a crashed daemon never finished; returns how many.
    ///
    /// Local: the staging files (`<object>#<n>`) of every upload but this process's own in
    /// progress. S3: `object_store` cannot list multipart uploads, so nothing is swept here
    /// (returns 0); uploads this crate abandons are aborted when their future is dropped, and
    /// those of a crashed process need the bucket lifecycle rule
    /// `AbortIncompleteMultipartUpload` (e.g. after 1 day) on the prefix.
    pub async fn sweep_incomplete(&self) -> Result<u64, BlobError> {
        let Some(local) = &self.inner.local else {
            return Ok(0);
        };
        let live = self
            .inner
            .uploading
            .lock()
            .keys()
            .map(|p| local.fs.path_to_filesystem(p))
            .collect::<Result<HashSet<_>, _>>()?;
        let root = local.root.clone();
        let removed = blocking("sweeping unfinished blob uploads", move || {
            local::sweep_staging(&root, &live)
        })
        .await?;
        if removed > 0 {
            tracing::info!(removed, "removed staging files of unfinished blob uploads");
        }
        Ok(removed)
    }
}

async fn blocking<T: Send + 'static>(
    context: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, BlobError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r)
        .map_err(|e| BlobError::io(context, e))
}
