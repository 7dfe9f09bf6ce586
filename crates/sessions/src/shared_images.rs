//! Images shared by the nodes of a cluster. Each node has an image store of its own; a named
//! image one node makes (an import, a build, an E2B template) is published: its tree archived
//! once per build into the blob store every node reaches (a layer archive, `koder-layer`, of
//! the whole tree), its manifest and the archive's size and sha256 recorded in the shared
//! database, and the name pointed at it there. A node asked for a name resolves it through
//! the database first ([`SharedImages::sync`]): a build it lacks is fetched (checked against
//! the recorded sha256 while it is unpacked; the tree made fit to share as every stored tree
//! is), a name moved elsewhere follows, a name deleted elsewhere is dropped here too. Names
//! the database never heard of (language packs, an operator's local imports) stay this
//! node's alone.

use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::sync::Arc;

use chrono::Utc;
use futures::{StreamExt as _, TryStreamExt as _};
use koder_blobs::{BlobInfo, Blobs};
use koder_image::{ImageError, ImageStore, Manifest, StoredImage};
use koder_store::{SharedImage, SharedName, Store};
use parking_lot::Mutex;

use crate::images::image_error;
use crate::Error;

/// The blob store's namespace of shared images: no tenant id starts with a dot.
const BLOB_TENANT: &str = ".images";

/// Bounds on one image's archive (a whole root tree, language runtimes included).
const LIMITS: koder_layer::Limits = koder_layer::Limits {
    max_bytes: 64 << 30,
    max_entries: 4 << 20,
};

/// How long a shared build no name points at is kept: see [`SharedImages::collect_garbage`].
pub(crate) const PUBLISH_GRACE: chrono::Duration = chrono::Duration::hours(1);

fn blob_key(digest: &str) -> String {
    format!("images/{digest}")
}

pub struct SharedImages {
    blobs: Blobs,
    store: Store,
    images: ImageStore,
    node_id: String,
    /// One fetch per build at a time: creates naming one image all wait for one download.
    fetching: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl SharedImages {
    pub fn new(blobs: Blobs, store: Store, images: ImageStore, node_id: String) -> Self {
        Self {
            blobs,
            store,
            images,
            node_id,
            fetching: Mutex::default(),
        }
    }

    /// Publishes the local image `name`: its build archived once (if no node did yet), then
    /// the name pointed at it.
    pub async fn publish(&self, name: &str) -> Result<(), Error> {
        let image = self.images.get(name).map_err(image_error)?;
        let digest = image.manifest.digest.clone();
        if self.store.shared_image(&digest).await?.is_none() {
            let blob = self.archive(&image).await?;
            let manifest_json = serde_json::to_string(&image.manifest)
                .map_err(|e| Error::Internal(format!("image manifest: {e}")))?;
            let shared = SharedImage {
                digest: digest.clone(),
                manifest_json,
                blob_size: blob.size,
                blob_sha256: blob.sha256,
                node_id: self.node_id.clone(),
            };
            self.store.put_shared_image(&shared, Utc::now()).await?;
            tracing::info!(image = %name, %digest, bytes = shared.blob_size, "image shared with the cluster");
        }
        self.store
            .set_shared_name(name, Some(&digest), Utc::now())
            .await?;
        Ok(())
    }

    /// Marks the shared `name` deleted: other nodes drop their copy of it when they resolve it.
    pub async fn unpublish(&self, name: &str) -> Result<(), Error> {
        if self.store.shared_name(name).await? != SharedName::Unknown {
            self.store.set_shared_name(name, None, Utc::now()).await?;
        }
        Ok(())
    }

    /// Forgets the shared build `digest` (its image deleted): every name of it is marked
    /// deleted, its record and archive go.
    pub async fn forget(&self, digest: &str) -> Result<(), Error> {
        if self.store.shared_image(digest).await?.is_some() {
            self.store.delete_shared_image(digest, Utc::now()).await?;
            self.blobs
                .delete(BLOB_TENANT, &blob_key(digest))
                .await
                .map_err(blob_error)?;
        }
        Ok(())
    }

    /// Forgets the shared builds no name points at any more (their names moved on or were
    /// deleted) that nothing in `keep` (the builds of unstopped sessions and live snapshots,
    /// on every node) may start a sandbox on, recorded before `before` ([`PUBLISH_GRACE`] ago:
    /// a node publishing a build records it just before its name). Returns how many went.
    pub async fn collect_garbage(
        &self,
        keep: &HashSet<String>,
        before: chrono::DateTime<Utc>,
    ) -> Result<usize, Error> {
        let mut gone = 0;
        for digest in self.store.unnamed_shared_images(before).await? {
            if !keep.contains(&digest) {
                self.forget(&digest).await?;
                gone += 1;
            }
        }
        Ok(gone)
    }

    /// Makes this node's `name` what the cluster says it is: a build fetched if it is not
    /// here, the local name moved to it or, when the cluster deleted it, removed. A name the
    /// cluster never shared is left as it is.
    pub async fn sync(&self, name: &str) -> Result<(), Error> {
        let local = self.images.digest_of_name(name).map_err(image_error)?;
        match self.store.shared_name(name).await? {
            SharedName::Unknown => Ok(()),
            SharedName::Deleted => {
                if local.is_some() {
                    self.images.unname(name).map_err(image_error)?;
                    tracing::info!(image = %name, "image name deleted on another node dropped");
                }
                Ok(())
            }
            SharedName::Points(digest) if local.as_deref() == Some(digest.as_str()) => Ok(()),
            SharedName::Points(digest) => {
                if self.fetch(&digest).await? {
                    return self.images.set_name(name, &digest).map_err(image_error);
                }
                // Its build was deleted meanwhile: the name goes with it.
                if local.is_some() {
                    self.images.unname(name).map_err(image_error)?;
                }
                Ok(())
            }
        }
    }

    /// Brings the shared build `digest` here unless the store has it; `false` when the cluster
    /// has no such build either.
    pub async fn fetch(&self, digest: &str) -> Result<bool, Error> {
        let lock = self
            .fetching
            .lock()
            .entry(digest.into())
            .or_default()
            .clone();
        let _one = lock.lock().await;
        let done = self.fetch_once(digest).await;
        let mut fetching = self.fetching.lock();
        if Arc::strong_count(&lock) == 2 {
            fetching.remove(digest);
        }
        done
    }

    async fn fetch_once(&self, digest: &str) -> Result<bool, Error> {
        if self
            .images
            .by_digest(digest)
            .map_err(image_error)?
            .is_some()
        {
            return Ok(true);
        }
        let Some(shared) = self.store.shared_image(digest).await? else {
            return Ok(false);
        };
        let manifest: Manifest = serde_json::from_str(&shared.manifest_json)
            .map_err(|e| Error::Internal(format!("shared image {digest}: manifest: {e}")))?;
        if manifest.digest != digest {
            return Err(Error::Internal(format!(
                "shared image {digest}: its manifest names {}",
                manifest.digest
            )));
        }
        let expected = BlobInfo {
            size: shared.blob_size,
            sha256: shared.blob_sha256,
        };
        let stream = self
            .blobs
            .get(BLOB_TENANT, &blob_key(digest), &expected)
            .await
            .map_err(blob_error)?
            .map_err(std::io::Error::other)
            .boxed();
        // The archive is unpacked as it arrives; a checksum found wrong at its end fails the
        // apply, and the staging tree is dropped with everything it held.
        let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(stream));
        let store = self.images.clone();
        let unpacked = tokio::task::spawn_blocking(move || unpack(&store, &manifest, reader))
            .await
            .map_err(|e| Error::Internal(format!("fetching image {digest}: {e}")))?;
        let image = unpacked
            .map_err(|e| Error::Internal(format!("fetching the shared image {digest}: {e}")))?;
        tracing::info!(%digest, name = %image.manifest.name, node = %shared.node_id, "shared image fetched");
        Ok(true)
    }

    /// Archives the image's tree into its blob.
    async fn archive(&self, image: &StoredImage) -> Result<BlobInfo, Error> {
        let (writer, upload) = self
            .blobs
            .writer(BLOB_TENANT, &blob_key(&image.manifest.digest))
            .map_err(blob_error)?;
        let root = image.root.clone();
        let capture = tokio::task::spawn_blocking(move || -> Result<(), String> {
            let dir = std::fs::File::open(&root).map_err(|e| format!("open the tree: {e}"))?;
            let mut writer = writer;
            koder_layer::capture(dir.as_fd(), &mut writer, &LIMITS).map_err(|e| e.to_string())?;
            writer.finish().map_err(|e| e.to_string())
        });
        let (uploaded, captured) = tokio::join!(upload, capture);
        captured
            .map_err(|e| Error::Internal(format!("archiving an image: {e}")))?
            .map_err(|e| Error::Internal(format!("archiving an image: {e}")))?;
        uploaded.map_err(blob_error)
    }
}

/// Unpacks a shared image's archive into the store under its manifest's digest. Blocking.
fn unpack(
    store: &ImageStore,
    manifest: &Manifest,
    archive: impl std::io::Read,
) -> Result<StoredImage, ImageError> {
    let staging = store.staging(&manifest.digest)?;
    let root = staging.rootfs();
    std::fs::create_dir(&root).map_err(ImageError::io("create the image root"))?;
    let dir = std::fs::File::open(&root).map_err(ImageError::io("open the image root"))?;
    let opts = koder_layer::ApplyOptions {
        limits: LIMITS,
        owners: koder_layer::Owners::AsIs,
    };
    koder_layer::apply(dir.as_fd(), archive, &opts).map_err(|e| match e {
        koder_layer::LayerError::Forbidden { path, why } => ImageError::Forbidden { path, why },
        other => ImageError::InvalidArchive(other.to_string()),
    })?;
    staging.finish_tree()?;
    std::fs::write(staging.log_path(), &manifest.build_log)
        .map_err(ImageError::io("write the build log"))?;
    staging.commit(manifest)
}

fn blob_error(e: koder_blobs::BlobError) -> Error {
    Error::Internal(format!("blob store: {e}"))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use koder_image::oci::testing::{layer, E};

    use super::*;

    /// Two nodes' image stores sharing one blob store and one database.
    struct Cluster {
        _dir: tempfile::TempDir,
        blobs: Blobs,
        db: Store,
        a: SharedImages,
        b: SharedImages,
    }

    impl Cluster {
        async fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let blobs = Blobs::open(&Default::default(), dir.path()).await.unwrap();
            let db = Store::open_in_memory().await.unwrap();
            let node = |name: &str| {
                let images = ImageStore::open(&dir.path().join(name)).unwrap();
                SharedImages::new(blobs.clone(), db.clone(), images, name.into())
            };
            let (a, b) = (node("a"), node("b"));
            Cluster {
                _dir: dir,
                blobs,
                db,
                a,
                b,
            }
        }
    }

    /// An image named `name` in `store` whose `/app/hello` holds `content` (`user`'s, 0640).
    fn image(store: &ImageStore, name: &str, content: &str) -> String {
        let digest = koder_image::store::digest_of(&content).unwrap();
        let staging = store.staging(&digest).unwrap();
        let app = staging.rootfs().join("app");
        std::fs::create_dir_all(&app).unwrap();
        let hello = app.join("hello");
        std::fs::write(&hello, content).unwrap();
        std::fs::set_permissions(&hello, std::fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::chown(&hello, Some(1000), Some(1000)).unwrap();
        staging.finish_tree().unwrap();
        let manifest = Manifest {
            workdir: "/app".into(),
            env: vec![("GREETING".into(), content.into())],
            ..Manifest::new(name, &digest, serde_json::json!({ "content": content }))
        };
        staging.commit(&manifest).unwrap();
        store.set_name(name, &digest).unwrap();
        digest
    }

    fn hello_of(store: &ImageStore, name: &str) -> (String, u32, u32) {
        let image = store.get(name).unwrap();
        let path = image.root.join("app/hello");
        let meta = std::fs::metadata(&path).unwrap();
        (
            std::fs::read_to_string(&path).unwrap(),
            meta.mode() & 0o7777,
            meta.uid(),
        )
    }

    /// What the store's `.tmp` holds: nothing once a fetch ended, however it ended.
    fn leftovers(store: &ImageStore) -> usize {
        std::fs::read_dir(store.root().join(".tmp")).map_or(0, |d| d.count())
    }

    #[tokio::test]
    async fn a_published_image_reaches_another_node_and_follows_its_name() {
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let c = Cluster::new().await;
        let first = image(&c.a.images, "app", "one\n");
        // Unknown to the cluster: the other node's name stays its own.
        c.b.sync("app").await.unwrap();
        assert!(c.b.images.get("app").is_err());

        c.a.publish("app").await.unwrap();
        c.b.sync("app").await.unwrap();
        assert_eq!(hello_of(&c.b.images, "app"), ("one\n".into(), 0o640, 1000));
        let (mine, theirs) = (
            c.a.images.get("app").unwrap(),
            c.b.images.get("app").unwrap(),
        );
        assert_eq!(theirs.manifest, mine.manifest);
        assert_eq!(theirs.manifest.digest, first);

        // Moved on node a: node b follows; the first build stays fetchable by digest.
        image(&c.a.images, "app", "two\n");
        c.a.publish("app").await.unwrap();
        c.b.sync("app").await.unwrap();
        assert_eq!(hello_of(&c.b.images, "app").0, "two\n");

        // Deleted on node a: node b drops its copy of the name.
        c.a.unpublish("app").await.unwrap();
        c.b.sync("app").await.unwrap();
        assert!(matches!(
            c.b.images.get("app"),
            Err(ImageError::NotFound(_))
        ));
        assert!(c.b.fetch(&first).await.unwrap());
        assert!(!c.b.fetch(&"0".repeat(64)).await.unwrap(), "no such build");
        // Unnamed now, both builds go once their grace passed, but one a session still
        // records; the other's archive goes with it.
        assert_eq!(
            c.a.collect_garbage(&HashSet::new(), Utc::now() - PUBLISH_GRACE)
                .await
                .unwrap(),
            0
        );
        let second = c.a.images.get("app").unwrap().manifest.digest;
        let later = Utc::now() + chrono::Duration::seconds(1);
        let keep = HashSet::from([first.clone()]);
        assert_eq!(c.a.collect_garbage(&keep, later).await.unwrap(), 1);
        assert!(c.db.shared_image(&first).await.unwrap().is_some());
        assert!(c.db.shared_image(&second).await.unwrap().is_none());
        let archive = c.blobs.local_file(BLOB_TENANT, &blob_key(&second)).unwrap();
        assert!(!archive.unwrap().exists());
        assert_eq!(leftovers(&c.b.images), 0);
    }

    #[tokio::test]
    async fn a_tampered_or_hostile_archive_leaves_nothing() {
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let c = Cluster::new().await;
        let digest = image(&c.a.images, "app", "one\n");
        c.a.publish("app").await.unwrap();
        let blob = c
            .blobs
            .local_file(BLOB_TENANT, &blob_key(&digest))
            .unwrap()
            .unwrap();
        let good = std::fs::read(&blob).unwrap();

        // One byte changed (same size): found at the archive's end, the tree dropped.
        let mut bad = good.clone();
        let at = bad.len() / 2;
        bad[at] ^= 0x55;
        std::fs::write(&blob, &bad).unwrap();
        assert!(c.b.sync("app").await.is_err());
        assert!(c.b.images.by_digest(&digest).unwrap().is_none());
        assert!(c.b.images.get("app").is_err());
        assert_eq!(leftovers(&c.b.images), 0);

        // An archive whose entry climbs out of the tree, recorded with its true checksum.
        let escape = layer(&[E::RawFile(b"../../escaped")]);
        let info = c
            .blobs
            .put(
                BLOB_TENANT,
                &blob_key(&digest),
                futures::stream::iter([Ok(bytes::Bytes::from(escape))]),
            )
            .await
            .unwrap();
        let mut shared = c.db.shared_image(&digest).await.unwrap().unwrap();
        c.db.delete_shared_image(&digest, Utc::now()).await.unwrap();
        (shared.blob_size, shared.blob_sha256) = (info.size, info.sha256);
        c.db.put_shared_image(&shared, Utc::now()).await.unwrap();
        c.db.set_shared_name("app", Some(&digest), Utc::now())
            .await
            .unwrap();
        let err = c.b.sync("app").await.unwrap_err().to_string();
        assert!(err.contains("escaped"), "{err}");
        assert!(c.b.images.by_digest(&digest).unwrap().is_none());
        assert_eq!(leftovers(&c.b.images), 0);
        assert!(!c.b.images.root().join("escaped").exists());
    }
}
