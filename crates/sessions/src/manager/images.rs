//! Images through the manager: list, inspect and delete, with the in-use rule (an image that a
//! running or paused session, a create in flight or a warm pool uses is not deleted).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};

use koder_api_types::{Image, ImageList};
use koder_auth::Identity;
use koder_image::{Manifest, StoredImage, HOST};
use koder_store::SharedName;

use super::Manager;
use crate::images::{self, image_error};
use crate::Error;

impl Manager {
    /// The image store, for transports that bring images in (imports, builds).
    pub fn image_store(&self) -> Option<&koder_image::ImageStore> {
        self.images.store()
    }

    /// Shares the image `name` with the other nodes of this node's cluster (its build
    /// archived to the blob store once, the name recorded in the database); nothing outside
    /// a cluster. Called by whatever names an image: imports, builds, E2B template tags.
    pub async fn publish_image(&self, name: &str) -> Result<(), Error> {
        match &self.shared {
            Some(shared) => shared.publish(name).await,
            None => Ok(()),
        }
    }

    /// The image names starting with `prefix` and the builds they point at, sorted by name:
    /// this node's and, in a cluster, every node's (the database's word wins for a name it
    /// knows, so a name deleted elsewhere is not listed).
    pub async fn image_names_with_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, String)>, Error> {
        let local = match self.images.store() {
            Some(store) => store.names_with_prefix(prefix).map_err(image_error)?,
            None => Vec::new(),
        };
        if self.shared.is_none() {
            return Ok(local);
        }
        let mut names: BTreeMap<String, Option<String>> = local
            .into_iter()
            .map(|(name, digest)| (name, Some(digest)))
            .collect();
        names.extend(self.store.shared_names_with_prefix(prefix).await?);
        Ok(names
            .into_iter()
            .filter_map(|(name, digest)| Some((name, digest?)))
            .collect())
    }

    /// Tells the other nodes the shared name `name` is gone (an E2B tag removed).
    pub async fn unpublish_image(&self, name: &str) -> Result<(), Error> {
        match &self.shared {
            Some(shared) => shared.unpublish(name).await,
            None => Ok(()),
        }
    }

    /// Makes this node's image `name` (or digest) what the cluster says it is before it is
    /// used: a build made on another node is fetched, a name moved or deleted there follows.
    /// `host`, and every name outside a cluster, are left as they are.
    pub async fn sync_image(&self, name: &str) -> Result<(), Error> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        if name == HOST {
            return Ok(());
        }
        if koder_image::store::is_digest(name) {
            shared.fetch(name).await?;
            return Ok(());
        }
        shared.sync(name).await
    }

    /// [`Manager::sync_image`] for a session's recorded image: its very build first (a
    /// session resumed, restored or forked on another node keeps the files it had), then its
    /// name.
    pub(super) async fn sync_build(&self, name: &str, build: Option<&str>) -> Result<(), Error> {
        if let (Some(shared), Some(build)) = (&self.shared, build) {
            if shared.fetch(build).await? {
                return Ok(());
            }
        }
        self.sync_image(name).await
    }

    /// The image a language's sessions run on when they name none (`host`, or its pack).
    pub fn language_image(&self, language: &str) -> String {
        self.images.default_for(language).to_string()
    }

    /// The stored image the session was created on (by the name it was created with), `None`
    /// for the host image or one no longer there.
    pub async fn session_image(
        &self,
        who: &Identity,
        id: &str,
    ) -> Result<Option<koder_image::StoredImage>, Error> {
        let record = self.record(who, id).await?;
        Ok(match record.image.as_str() {
            HOST => None,
            name => (record.image_digest.as_deref())
                .and_then(|d| self.images.lookup(d).ok())
                .or_else(|| self.images.lookup(name).ok()),
        })
    }

    /// `host` first, then every named image of the store and, in a cluster, the images other
    /// nodes made (their manifests read from the database, nothing fetched).
    pub async fn list_images(&self) -> Result<ImageList, Error> {
        let mut list = vec![images::host_view()];
        if let Some(store) = self.images.store() {
            let used = self.used_digests().await?;
            let mut named: Vec<StoredImage> = store.list().map_err(image_error)?;
            named.retain(|i| !i.names.is_empty());
            if self.shared.is_some() {
                named = self.with_shared_names(named).await?;
            }
            for image in named {
                let in_use = used.contains(&image.manifest.digest)
                    || !self
                        .images
                        .pooled_languages(&image.manifest.digest)
                        .is_empty();
                list.push(images::view(&image, in_use, false));
            }
        }
        Ok(ImageList { images: list })
    }

    /// One image by name (or digest), with the end of its build log.
    pub async fn get_image(&self, name: &str) -> Result<Image, Error> {
        if name == HOST {
            return Ok(images::host_view());
        }
        let image = self.image_anywhere(name).await?;
        let digest = &image.manifest.digest;
        let in_use = self.used_digests().await?.contains(digest)
            || !self.images.pooled_languages(digest).is_empty();
        Ok(images::view(&image, in_use, true))
    }

    /// Deletes the image `name` points at (every name of it too). `host` cannot go; an image in
    /// use is a 409 and stays.
    pub async fn delete_image(&self, name: &str) -> Result<Image, Error> {
        if name == HOST {
            return Err(Error::InvalidArgument(
                "the host image is generated by the server and cannot be deleted".into(),
            ));
        }
        if koder_image::store::is_digest(name) {
            return Err(Error::InvalidArgument(
                "delete an image by one of its names".into(),
            ));
        }
        let image = self.image_anywhere(name).await?;
        let digest = image.manifest.digest.clone();
        let pooled = self.images.pooled_languages(&digest);
        if !pooled.is_empty() {
            return Err(Error::ImageInUse(format!(
                "the warm pool of {} runs on it ([images] language_packs)",
                pooled.join(", ")
            )));
        }
        let _deleting = self.images.start_delete(&digest)?;
        let users = self.sessions_on(&digest).await?;
        if !users.is_empty() {
            return Err(Error::ImageInUse(format!(
                "{} session(s) run on it (first: {}); end them first",
                users.len(),
                users[0]
            )));
        }
        let snapshots = self.store.snapshots_on_image(&digest, self.now()).await?;
        if !snapshots.is_empty() {
            return Err(Error::ImageInUse(format!(
                "{} snapshot(s) were taken on it (first: {}); delete them first or let them \
                 expire",
                snapshots.len(),
                snapshots[0]
            )));
        }
        let store = self
            .images
            .store()
            .ok_or_else(|| Error::ImageNotFound(format!("image {name:?} not found")))?
            .clone();
        // By its build: in a cluster this node's copy of the name may be stale (moved or
        // deleted elsewhere, and not resolved here since), and the build may not be here.
        let (build, owned) = (digest.clone(), name.to_string());
        let deleted = tokio::task::spawn_blocking(move || {
            let deleted = match store.by_digest(&build)? {
                Some(_) => store.delete(&build)?,
                None => image,
            };
            store.unname(&owned)?;
            Ok(deleted)
        })
        .await
        .map_err(|e| Error::Internal(format!("delete task: {e}")))?
        .map_err(image_error)?;
        if let Some(shared) = &self.shared {
            shared.forget(&digest).await?;
        }
        tracing::info!(image = %name, digest = %digest, "image deleted");
        Ok(images::view(&deleted, false, false))
    }

    /// The image `name` names: in a cluster the build the database points it at (from its
    /// manifest there, with `name` alone for its names, when this node lacks it), else this
    /// node's.
    async fn image_anywhere(&self, name: &str) -> Result<StoredImage, Error> {
        if self.shared.is_none() || koder_image::store::is_digest(name) {
            return self.images.lookup(name);
        }
        let digest = match self.store.shared_name(name).await? {
            SharedName::Unknown => return self.images.lookup(name),
            SharedName::Deleted => return Err(not_found(name)),
            SharedName::Points(digest) => digest,
        };
        let mut image = self
            .image_build(&digest)
            .await?
            .ok_or_else(|| not_found(name))?;
        if image.names.is_empty() {
            image.names.push(name.to_string());
        }
        Ok(image)
    }

    /// The image build `digest`: this node's, or in a cluster one another node shared (from
    /// its manifest, with no names: nothing reads a tree through it), to describe it.
    pub async fn image_build(&self, digest: &str) -> Result<Option<StoredImage>, Error> {
        if let Some(local) = self.images.store() {
            if let Some(image) = local.by_digest(digest).map_err(image_error)? {
                return Ok(Some(image));
            }
        }
        if self.shared.is_none() {
            return Ok(None);
        }
        let Some(shared) = self.store.shared_image(digest).await? else {
            return Ok(None);
        };
        Ok(Some(shared_image(&shared.manifest_json)?))
    }

    /// `local` (this node's named images) with their names as the cluster has them: a name
    /// the database knows follows it (moved, or deleted, elsewhere), and a build this node
    /// lacks comes from its manifest there. Sorted by first name.
    async fn with_shared_names(&self, local: Vec<StoredImage>) -> Result<Vec<StoredImage>, Error> {
        let shared = self.store.shared_names_and_manifests().await?;
        let known: HashSet<&str> = shared.iter().map(|(name, _)| name.as_str()).collect();
        let mut by_digest: HashMap<String, StoredImage> = HashMap::new();
        for mut image in local {
            image.names.retain(|n| !known.contains(n.as_str()));
            by_digest.insert(image.manifest.digest.clone(), image);
        }
        for (name, build) in &shared {
            let Some((digest, manifest)) = build else {
                continue;
            };
            let image = match by_digest.entry(digest.clone()) {
                Entry::Occupied(found) => found.into_mut(),
                Entry::Vacant(slot) => slot.insert(shared_image(manifest)?),
            };
            image.names.push(name.clone());
        }
        let mut named: Vec<StoredImage> = by_digest
            .into_values()
            .filter(|i| !i.names.is_empty())
            .map(|mut i| {
                i.names.sort();
                i
            })
            .collect();
        named.sort_by(|a, b| a.names.cmp(&b.names));
        Ok(named)
    }

    /// The image a warm-pool lane names for sandboxes on `image` (`host` or a digest) of
    /// `language`: the lane's configured pack when it resolves to that digest.
    pub(super) fn pool_image_of(&self, image: &str, language: &str) -> String {
        match self.images.pool_images().get(language) {
            Some(name) if self.images.digest_of(name).as_deref() == Some(image) => name.clone(),
            _ => image.to_string(),
        }
    }

    /// Digests of the images unstopped sessions (running or paused) run on and live snapshots
    /// were taken on.
    async fn used_digests(&self) -> Result<Vec<String>, Error> {
        let mut digests: Vec<String> = self
            .store
            .live_sessions()
            .await?
            .iter()
            .filter_map(|r| self.build_of(r))
            .collect();
        digests.extend(self.store.kept_image_digests(self.now()).await?);
        digests.sort();
        digests.dedup();
        Ok(digests)
    }

    /// Ids of the unstopped sessions on `digest`.
    async fn sessions_on(&self, digest: &str) -> Result<Vec<String>, Error> {
        Ok(self
            .store
            .live_sessions()
            .await?
            .into_iter()
            .filter(|r| self.build_of(r).as_deref() == Some(digest))
            .map(|r| r.id)
            .collect())
    }

    /// The build a session runs on: the one it recorded, or (recorded before builds were)
    /// the one its image's name points at.
    fn build_of(&self, r: &koder_store::SessionRecord) -> Option<String> {
        (r.image_digest.clone()).or_else(|| self.images.digest_of(&r.image))
    }
}

fn not_found(name: &str) -> Error {
    Error::ImageNotFound(format!("image {name:?} not found"))
}

/// A build another node shared, described by its manifest as that node recorded it: no
/// names, and no tree on this node (nothing reads one through this value).
fn shared_image(manifest: &str) -> Result<StoredImage, Error> {
    let manifest: Manifest = serde_json::from_str(manifest)
        .map_err(|e| Error::Internal(format!("shared image manifest: {e}")))?;
    Ok(StoredImage {
        manifest,
        names: Vec::new(),
        root: std::path::PathBuf::new(),
    })
}
