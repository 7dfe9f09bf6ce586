//! Captured layers on this host: the agent's tar stream goes at once into the blob store
//! (the durable copy, tenant-scoped) and into a local cache (what runtimes apply a layer
//! from); a layer missing from the cache is fetched back and checked against its sha256.
//!
//! A fork's layer is at first only a tree on this host ([`Layers::copy_from`]: the source's
//! writable layer copied by its runtime, used as it is by the copies): no blob, no row, nothing
//! counted against the tenant's snapshot storage. Only what outlives the copies' sandboxes (a
//! snapshot, a pause to disk) needs it stored; [`Layers::make_durable`] archives the tree then,
//! into the same blob, cache file and row a capture makes. Forks that are thrown away (the
//! usual end of one) never pay for storing.
//!
//! Crash safety: cache files are written under a `.part` name and renamed when complete, a
//! blob is visible only once complete, and the layer's row is inserted last; `sweep` removes
//! whatever a crash left between those steps, and every fork's tree (their sandboxes did not
//! outlive the daemon; a stored one has its blob).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use chrono::Utc;
use futures::StreamExt;
use koder_agent_protocol::client::LayerCapture;
use koder_agent_protocol::AgentClient;
use koder_blobs::{BlobConfig, BlobInfo, Blobs};
use koder_runtime::{LayerBounds, RuntimeError, Sandbox};
use koder_store::{LayerRecord, Store};
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::Error;

/// Where a layer's blob lives inside its tenant.
fn blob_key(layer_id: &str) -> String {
    format!("layers/{layer_id}")
}

const PART: &str = ".part";
/// Chunks buffered between the agent and the blob upload.
const UPLOAD_QUEUE: usize = 8;

pub struct Layers {
    blobs: Blobs,
    cache: PathBuf,
    store: Store,
    /// One fetch per layer at a time: forks of one snapshot all wait for the same download.
    fetching: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Layers captured but not yet listed by a snapshot or session: the collector keeps off.
    pinned: Arc<Mutex<HashMap<String, u32>>>,
    /// Fork layers of this host that are trees (stored or not yet), by id.
    copied: Mutex<HashMap<String, Arc<Copied>>>,
}

struct Copied {
    tenant: String,
    tree: PathBuf,
    /// Whether the tree is stored as a layer too; held while it is being stored.
    stored: tokio::sync::Mutex<bool>,
}

/// Where a layer's archive comes from.
enum Archive {
    /// The agent's capture stream.
    Agent(LayerCapture),
    /// A fork's tree archived on a blocking thread.
    Tree {
        chunks: mpsc::Receiver<Vec<u8>>,
        done: tokio::task::JoinHandle<Result<koder_layer::Stats, koder_layer::LayerError>>,
    },
}

impl Archive {
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, Error> {
        match self {
            Self::Agent(capture) => Ok(capture.next_chunk().await?),
            Self::Tree { chunks, .. } => Ok(chunks.recv().await),
        }
    }

    /// The archive's entry count, once every chunk was read.
    async fn entries(self) -> Result<u64, Error> {
        match self {
            Self::Agent(capture) => capture
                .end()
                .map(|(entries, _)| entries)
                .ok_or_else(|| Error::Internal("layer capture ended early".into())),
            // Dropped first: a thread still writing (the upload stopped reading) then ends.
            Self::Tree { chunks, done } => {
                drop(chunks);
                done.await
                    .map_err(|e| Error::Internal(format!("archiving a fork's layer: {e}")))?
                    .map(|stats| stats.entries)
                    .map_err(|e| match e.is_quota() {
                        true => Error::PayloadTooLarge(e.to_string()),
                        false => Error::Internal(format!("archiving a fork's layer: {e}")),
                    })
            }
        }
    }

    /// Archives `tree` (a fork's copy, owners already the sandbox's own) on a blocking thread.
    fn of_tree(tree: PathBuf, limits: koder_layer::Limits) -> Self {
        let (tx, chunks) = mpsc::channel(UPLOAD_QUEUE);
        let done = tokio::task::spawn_blocking(move || {
            let root = std::fs::File::open(&tree).map_err(|e| koder_layer::LayerError::Io {
                context: format!("open {}", tree.display()),
                source: e,
            })?;
            let writer = std::io::BufWriter::with_capacity(CHUNK, ChunkSender(tx));
            koder_layer::capture(std::os::fd::AsFd::as_fd(&root), writer, &limits)
        });
        Self::Tree { chunks, done }
    }
}

/// Size of the chunks a tree's archive is sent in.
const CHUNK: usize = 256 * 1024;

/// Hands each write on as one chunk (behind a `BufWriter`, so chunks are `CHUNK` long).
struct ChunkSender(mpsc::Sender<Vec<u8>>);

impl std::io::Write for ChunkSender {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(buf.to_vec())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Keeps layers from the garbage collector until whoever needs them has recorded a reference
/// to them (or given up, when the collector may take them).
pub struct Pin {
    ids: Vec<String>,
    pinned: Arc<Mutex<HashMap<String, u32>>>,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut pinned = self.pinned.lock();
        for id in &self.ids {
            if let Some(n) = pinned.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    pinned.remove(id);
                }
            }
        }
    }
}

impl Layers {
    pub async fn open(cfg: &BlobConfig, data_dir: &Path, store: Store) -> Result<Self, Error> {
        let blobs = Blobs::open(cfg, data_dir).await.map_err(blob_error)?;
        let cache = data_dir.join("layers");
        // Layers hold sandbox files: nobody but the daemon reads them.
        tokio::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&cache)
            .await
            .map_err(|e| Error::Internal(format!("create {}: {e}", cache.display())))?;
        Ok(Self {
            blobs,
            cache,
            store,
            fetching: Mutex::default(),
            pinned: Arc::default(),
            copied: Mutex::default(),
        })
    }

    /// The blob store the layers live in (shared images live there too).
    pub(crate) fn blobs(&self) -> &Blobs {
        &self.blobs
    }

    /// Pins the layers `ids` while the returned [`Pin`] lives.
    pub fn pin(&self, ids: &[String]) -> Pin {
        let mut pinned = self.pinned.lock();
        for id in ids {
            *pinned.entry(id.clone()).or_default() += 1;
        }
        Pin {
            ids: ids.to_vec(),
            pinned: self.pinned.clone(),
        }
    }

    fn cached(&self, id: &str) -> PathBuf {
        self.cache.join(format!("{id}.tar"))
    }

    /// Streams the sandbox's writable layer into a new layer of `tenant`. The caller has frozen
    /// the sandbox's processes. `max_bytes` bounds the stored size (the tenant's room). The
    /// layer stays pinned while the returned [`Pin`] lives.
    pub async fn capture(
        &self,
        tenant: &str,
        agent: &AgentClient,
        max_bytes: u64,
        max_entries: u64,
    ) -> Result<(LayerRecord, Pin), Error> {
        let id = new_id();
        let pin = self.pin(std::slice::from_ref(&id));
        let archive = Archive::Agent(agent.capture_layer(max_bytes, max_entries).await?);
        let record = self.store_archive(tenant, &id, archive, max_bytes).await?;
        Ok((record, pin))
    }

    /// Stores `archive` as the layer `id`: blob, cache file, row; nothing of it on error.
    async fn store_archive(
        &self,
        tenant: &str,
        id: &str,
        archive: Archive,
        max_bytes: u64,
    ) -> Result<LayerRecord, Error> {
        let part = self.cache.join(format!("{id}.tar{PART}"));
        let result = self
            .capture_into(tenant, id, &part, archive, max_bytes)
            .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&part).await;
            let _ = self.blobs.delete(tenant, &blob_key(id)).await;
        }
        result
    }

    /// A fork's layer: the sandbox's writable layer copied by its runtime into a tree of this
    /// host, pinned while the returned [`Pin`] lives. The caller has frozen the sandbox.
    /// `None` where the runtime cannot copy (capture through the agent instead).
    pub async fn copy_from(
        &self,
        tenant: &str,
        sandbox: &dyn Sandbox,
        bounds: LayerBounds,
    ) -> Result<Option<(String, Pin)>, Error> {
        let id = new_id();
        let pin = self.pin(std::slice::from_ref(&id));
        let tree = self.cache.join(format!("{id}.tree"));
        let part = self.cache.join(format!("{id}.tree{PART}"));
        let made = async {
            tokio::fs::create_dir(&part)
                .await
                .map_err(|e| Error::Internal(format!("create a fork's layer: {e}")))?;
            sandbox
                .copy_writable_layer(&part, bounds)
                .await
                .map_err(|e| match e {
                    RuntimeError::Exhausted(m) => Error::PayloadTooLarge(m),
                    other => other.into(),
                })?;
            tokio::fs::rename(&part, &tree)
                .await
                .map_err(|e| Error::Internal(format!("commit a fork's layer: {e}")))
        };
        match made.await {
            Ok(()) => {
                let copied = Copied {
                    tenant: tenant.to_string(),
                    tree,
                    stored: tokio::sync::Mutex::new(false),
                };
                self.copied.lock().insert(id.clone(), Arc::new(copied));
                Ok(Some((id, pin)))
            }
            Err(e) => {
                remove_tree(part).await;
                match e {
                    Error::NotImplemented(_) => Ok(None),
                    other => Err(other),
                }
            }
        }
    }

    /// A new empty directory of the cache for a fork's clone of its source's disk, removed
    /// when dropped (the copies made, or the request gone); a crash leaves it to
    /// [`Layers::sweep`], as a fork's tree.
    pub async fn clone_dir(&self) -> Result<CloneDir, Error> {
        let dir = self.cache.join(format!("{}.clone", new_id()));
        tokio::fs::create_dir(&dir)
            .await
            .map_err(|e| Error::Internal(format!("create a fork's clone dir: {e}")))?;
        Ok(CloneDir(dir))
    }

    /// The tree of a fork's layer `id` of `tenant`, while this host has it.
    pub fn copied_tree(&self, tenant: &str, id: &str) -> Option<PathBuf> {
        let copied = self.copied.lock();
        let c = copied.get(id)?;
        (c.tenant == tenant).then(|| c.tree.clone())
    }

    /// Whether any of `ids` is a fork's layer not stored yet.
    pub fn any_unstored(&self, ids: &[String]) -> bool {
        let copied = self.copied.lock();
        ids.iter().any(|id| {
            copied
                .get(id)
                .is_some_and(|c| c.stored.try_lock().map_or(true, |stored| !*stored))
        })
    }

    /// Stores every fork's layer among `ids` not stored yet (blob, cache file, row), each at
    /// most `max_bytes` (the tenant's snapshot storage left): what a snapshot or a pause to
    /// disk lists must outlive this host's trees.
    pub async fn make_durable(&self, ids: &[String], max_bytes: u64) -> Result<(), Error> {
        for id in ids {
            let Some(c) = self.copied.lock().get(id).cloned() else {
                continue;
            };
            let mut stored = c.stored.lock().await;
            if *stored {
                continue;
            }
            let limits = koder_layer::Limits {
                max_bytes,
                max_entries: u64::MAX,
            };
            let archive = Archive::of_tree(c.tree.clone(), limits);
            self.store_archive(&c.tenant, id, archive, max_bytes)
                .await?;
            *stored = true;
        }
        Ok(())
    }

    async fn capture_into(
        &self,
        tenant: &str,
        id: &str,
        part: &Path,
        mut capture: Archive,
        max_bytes: u64,
    ) -> Result<LayerRecord, Error> {
        let key = blob_key(id);
        // A local blob becomes the cache file by a hard link once stored: written once.
        let local = self.blobs.local_file(tenant, &key).map_err(blob_error)?;
        let mut file = match local {
            Some(_) => None,
            None => Some(
                tokio::fs::File::create(part)
                    .await
                    .map_err(|e| Error::Internal(format!("create layer cache file: {e}")))?,
            ),
        };
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(UPLOAD_QUEUE);
        let body = tokio_stream::wrappers::ReceiverStream::new(rx);
        let upload = self.blobs.put(tenant, &key, body);
        let produce = async {
            let mut stored: u64 = 0;
            while let Some(chunk) = capture.next_chunk().await? {
                stored = stored.saturating_add(chunk.len() as u64);
                if stored > max_bytes {
                    return Err(Error::QuotaSnapshotStorage(format!(
                        "the layer needs more than the {max_bytes} bytes of snapshot storage left"
                    )));
                }
                if let Some(file) = file.as_mut() {
                    file.write_all(&chunk)
                        .await
                        .map_err(|e| Error::Internal(format!("write layer cache file: {e}")))?;
                }
                if tx.send(Ok(Bytes::from(chunk))).await.is_err() {
                    break;
                }
            }
            drop(tx);
            if let Some(file) = file.as_mut() {
                file.flush()
                    .await
                    .map_err(|e| Error::Internal(format!("write layer cache file: {e}")))?;
            }
            capture.entries().await
        };
        let (produced, uploaded) = tokio::join!(produce, upload);
        let entries = produced?;
        let info = uploaded.map_err(blob_error)?;
        if let Some(blob) = &local {
            share(blob, part).await?;
        }
        tokio::fs::rename(part, self.cached(id))
            .await
            .map_err(|e| Error::Internal(format!("commit layer cache file: {e}")))?;
        koder_hostkit::crash::point("layer-before-commit");
        let record = LayerRecord {
            id: id.to_string(),
            tenant_id: tenant.to_string(),
            blob_key: blob_key(id),
            size_bytes: info.size,
            sha256: info.sha256,
            entries,
            created_at: Utc::now(),
        };
        self.store.insert_layer(&record).await?;
        Ok(record)
    }

    /// Local files of these layers, in order, fetching (and verifying) any not cached here.
    pub async fn local(&self, layers: &[LayerRecord]) -> Result<Vec<PathBuf>, Error> {
        let mut out = Vec::with_capacity(layers.len());
        for l in layers {
            out.push(self.fetch(l).await?);
        }
        Ok(out)
    }

    async fn fetch(&self, l: &LayerRecord) -> Result<PathBuf, Error> {
        let path = self.cached(&l.id);
        let gate = self
            .fetching
            .lock()
            .entry(l.id.clone())
            .or_default()
            .clone();
        let _held = gate.lock().await;
        if tokio::fs::try_exists(&path).await.unwrap_or(false) {
            return Ok(path);
        }
        let part = self.cache.join(format!("{}.tar{PART}", l.id));
        let fetched = match self.blobs.local_file(&l.tenant_id, &l.blob_key) {
            Ok(Some(blob)) => match self.read_back(l, None).await {
                Ok(()) => share(&blob, &part).await,
                Err(e) => Err(e),
            },
            _ => self.read_back(l, Some(&part)).await,
        };
        if let Err(e) = fetched {
            let _ = tokio::fs::remove_file(&part).await;
            return Err(e);
        }
        tokio::fs::rename(&part, &path)
            .await
            .map_err(|e| Error::Internal(format!("commit layer cache file: {e}")))?;
        Ok(path)
    }

    /// Streams the layer's blob through the checksumming reader into `part` (a fetch from a
    /// remote store), or only checks it when `part` is `None` (a local blob about to be shared).
    async fn read_back(&self, l: &LayerRecord, part: Option<&Path>) -> Result<(), Error> {
        let expected = BlobInfo {
            size: l.size_bytes,
            sha256: l.sha256.clone(),
        };
        let body = self
            .blobs
            .get(&l.tenant_id, &l.blob_key, &expected)
            .await
            .map_err(blob_error)?;
        let mut body = std::pin::pin!(body);
        let write_error =
            |e: std::io::Error| Error::Internal(format!("write layer cache file: {e}"));
        let mut file = match part {
            Some(p) => Some(tokio::fs::File::create(p).await.map_err(write_error)?),
            None => None,
        };
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(blob_error)?;
            if let Some(f) = file.as_mut() {
                f.write_all(&chunk).await.map_err(write_error)?;
            }
        }
        if let Some(f) = file.as_mut() {
            f.flush().await.map_err(write_error)?;
        }
        Ok(())
    }

    /// Deletes a layer everywhere: blob, cache file, row (in that order, so a crash leaves a
    /// row whose blob is gone only if the delete already happened, which the next sweep
    /// finishes).
    pub async fn remove(&self, l: &LayerRecord) -> Result<(), Error> {
        self.blobs
            .delete(&l.tenant_id, &l.blob_key)
            .await
            .map_err(blob_error)?;
        let _ = tokio::fs::remove_file(self.cached(&l.id)).await;
        self.store.delete_layer(&l.id).await?;
        Ok(())
    }

    /// Garbage collection: layers nothing references any more, but those recorded after
    /// `spare_since` (while other nodes share the store: a capture there records its layer
    /// before its reference, and pins are this daemon's own). Run by the reaper.
    pub async fn collect_garbage(
        &self,
        spare_since: Option<chrono::DateTime<Utc>>,
    ) -> Result<u64, Error> {
        // The pins as they were before the references are read: a capture drops its pin only
        // once its reference is recorded, so a layer unpinned since then is seen referenced,
        // and one still pinned then is spared.
        let pinned: HashSet<String> = self.pinned.lock().keys().cloned().collect();
        // Candidates before references (see `Store::referenced_layers`).
        let candidates = self.store.all_layers().await?;
        let used = self.store.referenced_layers().await?;
        self.collect_trees(&used, &pinned).await;
        let mut n = 0;
        for l in candidates.into_iter().filter(|l| !used.contains(&l.id)) {
            let recent = spare_since.is_some_and(|since| l.created_at > since);
            if recent || pinned.contains(&l.id) || self.pinned.lock().contains_key(&l.id) {
                continue;
            }
            self.remove(&l).await?;
            n += 1;
        }
        Ok(n)
    }

    /// Deletes the fork trees nothing lists (`used`) or pins: their copies have ended.
    async fn collect_trees(&self, used: &HashSet<String>, pinned: &HashSet<String>) {
        let gone: Vec<Arc<Copied>> = {
            let mut copied = self.copied.lock();
            let unused: Vec<String> = copied
                .keys()
                .filter(|id| !used.contains(*id) && !pinned.contains(*id))
                .filter(|id| !self.pinned.lock().contains_key(*id))
                .cloned()
                .collect();
            unused.iter().filter_map(|id| copied.remove(id)).collect()
        };
        for c in gone {
            remove_tree(c.tree.clone()).await;
        }
    }

    /// At start-up, before any capture: unfinished uploads and cache files, blobs and cache
    /// files without a row (a crash between the steps of `capture`), unreferenced layers.
    /// `spare_since` as for [`Layers::collect_garbage`].
    pub async fn sweep(&self, spare_since: Option<chrono::DateTime<Utc>>) -> Result<(), Error> {
        self.blobs.sweep_incomplete().await.map_err(blob_error)?;
        let known: HashSet<String> = self
            .store
            .all_layers()
            .await?
            .into_iter()
            .map(|l| l.id)
            .collect();
        for tenant in self.blobs.list_tenants().await.map_err(blob_error)? {
            for (key, _) in self.blobs.list(&tenant).await.map_err(blob_error)? {
                let orphan = key
                    .strip_prefix("layers/")
                    .is_some_and(|id| !known.contains(id));
                if orphan {
                    tracing::info!(tenant, key, "removing a layer blob a crash left");
                    self.blobs.delete(&tenant, &key).await.map_err(blob_error)?;
                }
            }
        }
        let mut dir = tokio::fs::read_dir(&self.cache)
            .await
            .map_err(|e| Error::Internal(format!("read layer cache: {e}")))?;
        while let Ok(Some(entry)) = dir.next_entry().await {
            let name = entry.file_name().to_string_lossy().into_owned();
            let keep = name
                .strip_suffix(".tar")
                .is_some_and(|id| known.contains(id));
            // Fork trees too: the sandboxes they were made for did not outlive the daemon.
            if entry.file_type().await.is_ok_and(|t| t.is_dir()) {
                remove_tree(entry.path()).await;
            } else if !keep {
                let _ = tokio::fs::remove_file(entry.path()).await;
            }
        }
        self.collect_garbage(spare_since).await?;
        Ok(())
    }
}

fn new_id() -> String {
    format!("lyr-{}", uuid::Uuid::new_v4().simple())
}

/// [`Layers::clone_dir`]'s directory.
pub struct CloneDir(PathBuf);

impl CloneDir {
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Removes the directory and returns once it is gone (a drop only starts that): a fork
    /// answers with no clone of its source's disk left on the data dir.
    pub async fn remove(mut self) {
        remove_tree(std::mem::take(&mut self.0)).await;
    }
}

impl Drop for CloneDir {
    fn drop(&mut self) {
        let dir = std::mem::take(&mut self.0);
        // Removed already.
        if dir.as_os_str().is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(remove_tree(dir))),
            Err(_) => drop(std::fs::remove_dir_all(dir)),
        }
    }
}

/// Deletes a fork's tree (sandbox-made: `remove_dir_all` never follows its symlinks) on a
/// blocking thread.
async fn remove_tree(tree: PathBuf) {
    let removed = tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&tree) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err((tree, e)),
        _ => Ok(()),
    })
    .await;
    if let Ok(Err((tree, e))) = removed {
        tracing::warn!(tree = %tree.display(), error = %e, "deleting a fork's layer");
    }
}

/// `to` becomes the same file as `from` (a hard link: layers never change once stored), or a
/// copy where the two are on different filesystems.
async fn share(from: &Path, to: &Path) -> Result<(), Error> {
    let _ = tokio::fs::remove_file(to).await;
    if tokio::fs::hard_link(from, to).await.is_ok() {
        return Ok(());
    }
    tokio::fs::copy(from, to)
        .await
        .map(|_| ())
        .map_err(|e| Error::Internal(format!("copy layer into the cache: {e}")))
}

fn blob_error(e: koder_blobs::BlobError) -> Error {
    Error::Internal(format!("blob store: {e}"))
}
