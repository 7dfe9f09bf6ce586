//! The image store: content-addressed images under `<images_dir>/store`.
//!
//! ```text
//! store/<digest>/manifest.json   an image: its manifest...
//! store/<digest>/rootfs/         ...and its read-only root tree (sandbox owners, no setuid;
//!                                the directory itself host root's alone)
//! store/<digest>/build.log
//! store/<digest>/derived/        files made from the tree for a runtime (a microVM's root disk):
//!                                each complete once visible, never changed, gone with the image
//! store/names/<name>             symlink to "<digest>": the names pointing at an image
//! store/<digest>/                 (recipe kind `template-step`) a template build's cached step:
//!                                 never listed, unnamed, kept by garbage collection while a
//!                                 build used it lately (its manifest's mtime)
//! store/.tmp/                    images being built or deleted (never listed)
//! ```
//!
//! An image is built in `.tmp` and renamed into place only once its tree and manifest are
//! complete and synced, so a listed image is always whole, also after a kill -9 mid-build; what
//! a killed build left in `.tmp` is collected later. Names are replaced atomically (a new
//! symlink renamed over the old). Which images sessions use is not the store's business: the
//! session manager checks that before it deletes one, and tells garbage collection which
//! unnamed builds its sessions and snapshots still need.

mod manifest;
pub mod name;

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::{lchown, symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub use manifest::{digest_of, Language, Manifest, Startup, MANIFEST_VERSION};
pub use name::{check_name, check_reference, is_digest};

use crate::Image;

const MANIFEST: &str = "manifest.json";
const ROOTFS: &str = "rootfs";
pub const BUILD_LOG: &str = "build.log";
/// A cached build step's own layer (what it changed), beside its tree.
const STEP_LAYER: &str = "layer.tar";
const NAMES: &str = "names";
/// Files a runtime made from an image's tree, beside it (see [`ImageStore::install_derived`]).
const DERIVED: &str = "derived";
const TMP: &str = ".tmp";

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The recipe kind of a template build's cached step (see [`is_step`]).
pub const STEP_KIND: &str = "template-step";

/// Whether an image is a template build's cached step rather than an image sessions name.
pub fn is_step(manifest: &Manifest) -> bool {
    manifest.recipe.get("kind").and_then(|k| k.as_str()) == Some(STEP_KIND)
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image {0:?} not found")]
    NotFound(String),
    #[error("invalid image name {0}")]
    InvalidName(String),
    #[error("image {digest}: unreadable manifest: {why}")]
    Corrupt { digest: String, why: String },
    #[error("image build failed: {0}")]
    Build(String),
    /// An archive that is no image (unreadable, no manifest, an unsupported layer format).
    #[error("invalid image archive: {0}")]
    InvalidArchive(String),
    /// An archive entry that would leave the tree or write through a link.
    #[error("refused archive entry {path}: {why}")]
    Forbidden { path: String, why: &'static str },
    /// An archive over its bounds (bytes or entries): nothing of it is kept.
    #[error("image archive too large: {0}")]
    TooLarge(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl ImageError {
    pub fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> Self {
        let context = context.into();
        move |source| ImageError::Io { context, source }
    }
}

type Result<T> = std::result::Result<T, ImageError>;

/// A complete image in the store.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredImage {
    pub manifest: Manifest,
    /// The names pointing at it, sorted.
    pub names: Vec<String>,
    /// Its root tree.
    pub root: PathBuf,
}

impl StoredImage {
    /// A cached build step's layer file (what the step changed, as captured).
    pub fn step_layer(&self) -> PathBuf {
        self.root.with_file_name(STEP_LAYER)
    }

    /// Where the file `name` derived from this image lives (it may not exist yet): see
    /// [`ImageStore::install_derived`].
    pub fn derived(&self, name: &str) -> PathBuf {
        self.root.with_file_name(DERIVED).join(name)
    }

    /// The image as a runtime mounts it: the tree alone (it has its own /usr), with its
    /// environment.
    pub fn image(&self) -> Image {
        Image {
            name: self.manifest.name.clone(),
            layer: self.root.clone(),
            ro_binds: Vec::new(),
            env: self.manifest.env.clone(),
            workdir: self.manifest.workdir.clone(),
        }
    }
}

/// The store under one images directory. Cheap to clone; every call reads the disk, so a
/// store opened by the CLI and one opened by the daemon see each other's changes.
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
}

impl ImageStore {
    /// Opens (creating) the store under `images_dir`. Sandbox uids traverse it to their lower
    /// layer, so the directories down to the trees are 0711; names and temporary trees are the
    /// daemon's alone.
    pub fn open(images_dir: &Path) -> Result<Self> {
        let root = images_dir.join("store");
        for (dir, mode) in [
            (images_dir.to_path_buf(), 0o711),
            (root.clone(), 0o711),
            (root.join(NAMES), 0o700),
            (root.join(TMP), 0o700),
        ] {
            std::fs::create_dir_all(&dir)
                .and_then(|()| {
                    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
                })
                .map_err(ImageError::io(format!("create {}", dir.display())))?;
        }
        Ok(Self { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The image a reference (name or digest) points at.
    pub fn get(&self, reference: &str) -> Result<StoredImage> {
        check_reference(reference)?;
        let digest = if is_digest(reference) {
            reference.to_string()
        } else {
            self.digest_of_name(reference)?
                .ok_or_else(|| ImageError::NotFound(reference.into()))?
        };
        self.by_digest(&digest)?
            .ok_or_else(|| ImageError::NotFound(reference.into()))
    }

    /// The digest a name points at, if it does.
    pub fn digest_of_name(&self, name: &str) -> Result<Option<String>> {
        check_name(name)?;
        match std::fs::read_link(self.root.join(NAMES).join(name)) {
            Ok(target) => Ok(target.to_str().filter(|t| is_digest(t)).map(str::to_string)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ImageError::io(format!("read name {name:?}"))(e)),
        }
    }

    /// The image stored under `digest`, if there is one.
    pub fn by_digest(&self, digest: &str) -> Result<Option<StoredImage>> {
        if !is_digest(digest) {
            return Ok(None);
        }
        let dir = self.root.join(digest);
        let text = match std::fs::read_to_string(dir.join(MANIFEST)) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ImageError::io(format!("read manifest of {digest}"))(e)),
        };
        let manifest: Manifest = serde_json::from_str(&text).map_err(|e| ImageError::Corrupt {
            digest: digest.into(),
            why: e.to_string(),
        })?;
        Ok(Some(StoredImage {
            names: self.names_of(digest)?,
            manifest,
            root: dir.join(ROOTFS),
        }))
    }

    /// Every complete image, by name of first name (unnamed ones last); cached build steps
    /// are no images of their own.
    pub fn list(&self) -> Result<Vec<StoredImage>> {
        let mut images = Vec::new();
        for entry in read_dir(&self.root)? {
            let name = entry.file_name();
            if let Some(image) = name.to_str().map(|d| self.by_digest(d)).transpose()? {
                images.extend(image.filter(|i| !is_step(&i.manifest)));
            }
        }
        images.sort_by(|a, b| {
            (a.names.is_empty(), a.names.first()).cmp(&(b.names.is_empty(), b.names.first()))
        });
        Ok(images)
    }

    /// The names pointing at `digest`, sorted.
    pub fn names_of(&self, digest: &str) -> Result<Vec<String>> {
        Ok(self
            .all_names()?
            .into_iter()
            .filter(|(_, d)| d == digest)
            .map(|(n, _)| n)
            .collect())
    }

    /// (name, digest) of every name, sorted by name.
    fn all_names(&self) -> Result<Vec<(String, String)>> {
        let mut names = Vec::new();
        for entry in read_dir(&self.root.join(NAMES))? {
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if check_name(&name).is_err() {
                continue;
            }
            if let Some(digest) = self.digest_of_name(&name)? {
                names.push((name, digest));
            }
        }
        names.sort();
        Ok(names)
    }

    /// Points `name` at the image `digest` (replacing what it pointed at, atomically).
    pub fn set_name(&self, name: &str, digest: &str) -> Result<()> {
        check_name(name)?;
        if self.by_digest(digest)?.is_none() {
            return Err(ImageError::NotFound(digest.into()));
        }
        let names = self.root.join(NAMES);
        let tmp = names.join(format!(".{name}.{}", unique()));
        symlink(digest, &tmp).map_err(ImageError::io(format!("name {name:?}")))?;
        std::fs::rename(&tmp, names.join(name)).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            ImageError::io(format!("name {name:?}"))(e)
        })
    }

    /// Removes the name `name` (the image stays, under its other names, or unnamed until
    /// garbage collection); whether there was one.
    pub fn unname(&self, name: &str) -> Result<bool> {
        check_name(name)?;
        match std::fs::remove_file(self.root.join(NAMES).join(name)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(ImageError::io(format!("remove name {name:?}"))(e)),
        }
    }

    /// Every name starting with `prefix`, with the digest it points at, sorted by name.
    pub fn names_with_prefix(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        Ok(self
            .all_names()?
            .into_iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .collect())
    }

    /// Deletes the image `name` points at, with every name pointing at it; returns what it was.
    /// Names go first, so a concurrent lookup finds either the whole image or none.
    pub fn delete(&self, name: &str) -> Result<StoredImage> {
        let image = self.get(name)?;
        for other in &image.names {
            match std::fs::remove_file(self.root.join(NAMES).join(other)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(ImageError::io(format!("remove name {other:?}"))(e))
                }
                _ => {}
            }
        }
        self.remove_digest(&image.manifest.digest)?;
        Ok(image)
    }

    /// Removes a digest's tree: moved out of sight first, then deleted.
    fn remove_digest(&self, digest: &str) -> Result<()> {
        let doomed = self
            .root
            .join(TMP)
            .join(format!("deleted-{digest}.{}", unique()));
        match std::fs::rename(self.root.join(digest), &doomed) {
            Ok(()) => std::fs::remove_dir_all(&doomed)
                .map_err(ImageError::io(format!("delete image {digest}"))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ImageError::io(format!("delete image {digest}"))(e)),
        }
    }

    /// A fresh directory to build the image `digest` in; dropped without
    /// [`Staging::commit`], it is removed.
    pub fn staging(&self, digest: &str) -> Result<Staging> {
        if !is_digest(digest) {
            return Err(ImageError::InvalidName(format!("{digest:?}: not a digest")));
        }
        let dir = self.root.join(TMP).join(format!("{digest}.{}", unique()));
        std::fs::create_dir(&dir)
            .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)))
            .map_err(ImageError::io(format!("create {}", dir.display())))?;
        Ok(Staging {
            dir,
            digest: digest.into(),
            store: self.clone(),
            done: false,
        })
    }

    /// A fresh path in the store's `.tmp` for a file on its way in (an uploaded archive), on
    /// the store's filesystem; removed when the [`Scratch`] is dropped (or, should the process
    /// die, by [`ImageStore::collect_garbage`]).
    pub fn scratch(&self, what: &str) -> Scratch {
        Scratch(self.root.join(TMP).join(format!("{what}.{}", unique())))
    }

    /// Brings the image `reference` names in `other` into this store under the same digest and
    /// names, as hard links where both are on one filesystem (a copy otherwise): a pack built
    /// once into a cache serves many data dirs for the price of a tree of links.
    pub fn link_from(&self, other: &ImageStore, reference: &str) -> Result<StoredImage> {
        let source = other.get(reference)?;
        let digest = source.manifest.digest.clone();
        if self.by_digest(&digest)?.is_none() {
            let staging = self.staging(&digest)?;
            let from = other.root.join(&digest);
            for file in [MANIFEST, BUILD_LOG] {
                link_or_copy(&from.join(file), &staging.dir.join(file))
                    .map_err(ImageError::io(format!("link {file}")))?;
            }
            link_tree(&source.root, &staging.rootfs())
                .map_err(ImageError::io(format!("link image {digest}")))?;
            // Derived files are made from the same tree, so they fit the linked one.
            let derived = from.join(DERIVED);
            if derived.is_dir() {
                link_tree(&derived, &staging.dir.join(DERIVED)).map_err(ImageError::io(
                    format!("link the derived files of {digest}"),
                ))?;
            }
            staging.install()?;
        }
        for name in &source.names {
            self.set_name(name, &digest)?;
        }
        self.get(&digest)
    }

    /// Makes `file` (complete, in this store's filesystem, e.g. a [`Scratch`] path) the file
    /// `name` derived from `image`, as a hard link: a derived file is never half visible and,
    /// once there, never replaced (a concurrent builder's copy is dropped, the first stays), so
    /// whoever opened it keeps reading what the next one opens. Files of `image` whose names
    /// start with `supersedes` (older recipes of the same file) are removed. Returns its path.
    pub fn install_derived(
        &self,
        image: &StoredImage,
        name: &str,
        file: &Path,
        supersedes: &str,
    ) -> Result<PathBuf> {
        check_name(name)?;
        let target = image.derived(name);
        let dir = target.parent().unwrap_or(&self.root).to_path_buf();
        let ctx = |what: &str| format!("{what} {}", target.display());
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(ImageError::io(ctx("create the directory of"))(e))
            }
            _ => {}
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
            .map_err(ImageError::io(ctx("open up the directory of")))?;
        std::fs::File::open(file)
            .and_then(|f| f.sync_all())
            .map_err(ImageError::io(ctx("sync")))?;
        match std::fs::hard_link(file, &target) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(ImageError::io(ctx("install"))(e))
            }
            _ => {}
        }
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(ImageError::io(ctx("sync the directory of")))?;
        for entry in read_dir(&dir)? {
            let other = entry.file_name();
            let other = other.to_string_lossy();
            if other != name && other.starts_with(supersedes) {
                std::fs::remove_file(entry.path())
                    .map_err(ImageError::io(format!("remove {}", entry.path().display())))?;
            }
        }
        Ok(target)
    }

    /// Marks a build's cached step used now: garbage collection keeps it while it was used
    /// lately. (An image's tree is self-contained: a step going costs a later build its cache,
    /// never an image its files.)
    pub fn mark_used(&self, step: &StoredImage) -> Result<()> {
        let manifest = self.root.join(&step.manifest.digest).join(MANIFEST);
        std::fs::File::open(&manifest)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()))
            .map_err(ImageError::io(format!(
                "mark {} used",
                step.manifest.digest
            )))
    }

    /// How long ago the step `digest` was made or last found cached.
    fn unused_for(&self, digest: &str) -> std::time::Duration {
        std::fs::metadata(self.root.join(digest).join(MANIFEST))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|used| used.elapsed().ok())
            .unwrap_or_default()
    }

    /// Removes what no name points at (but the digests in `keep`: the builds recorded sessions
    /// and snapshots were made on; and build steps used within `steps_unused_for`) and what
    /// builds and deletes a dead process began. Call where no sandbox and no build can be
    /// using an unnamed image outside `keep` (the daemon's start).
    pub fn collect_garbage(
        &self,
        keep: &HashSet<String>,
        steps_unused_for: std::time::Duration,
    ) -> Result<Vec<String>> {
        let named: HashSet<String> = self.all_names()?.into_iter().map(|(_, d)| d).collect();
        let mut removed = Vec::new();
        for entry in read_dir(&self.root)? {
            let Some(digest) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let step = || {
                matches!(self.by_digest(&digest), Ok(Some(i)) if is_step(&i.manifest))
                    && self.unused_for(&digest) < steps_unused_for
            };
            let unused = !named.contains(&digest) && !keep.contains(&digest);
            if is_digest(&digest) && unused && !step() {
                self.remove_digest(&digest)?;
                removed.push(digest);
            }
        }
        for entry in read_dir(&self.root.join(TMP))? {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !owner_alive(&name) {
                let path = entry.path();
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                if is_dir {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                }
                .map_err(ImageError::io(format!("remove {}", entry.path().display())))?;
                removed.push(name);
            }
        }
        Ok(removed)
    }
}

/// A temporary file path in the store's `.tmp`, removed on drop.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        match std::fs::remove_file(&self.0) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                tracing::warn!(path = %self.0.display(), error = %e, "remove scratch file");
            }
            _ => {}
        }
    }
}

/// An image under construction in the store's `.tmp`.
pub struct Staging {
    dir: PathBuf,
    digest: String,
    store: ImageStore,
    done: bool,
}

impl Staging {
    /// Where its root tree goes (not created: builders such as mmdebstrap create it).
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join(ROOTFS)
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join(BUILD_LOG)
    }

    /// Where a build step's layer file goes (see [`StoredImage::step_layer`]).
    pub fn step_layer_path(&self) -> PathBuf {
        self.dir.join(STEP_LAYER)
    }

    /// Makes the root tree a copy of `image`'s made of hard links (a later change must
    /// replace a file, never write into it: the layer apply and [`finish_tree`] do).
    pub fn link_root_from(&self, image: &StoredImage) -> Result<()> {
        link_tree(&image.root, &self.rootfs()).map_err(ImageError::io(format!(
            "link image {}",
            image.manifest.digest
        )))
    }

    /// Makes the root tree (a linked copy with a build step's layer applied on it) fit to be
    /// shared: overlay whiteouts and other special files gone, owners the sandbox's, no setuid,
    /// the generated accounts in place. Returns its size in bytes.
    pub fn finish_tree(&self) -> Result<u64> {
        crate::rootfs::sanitize(&self.rootfs()).map_err(ImageError::io("finish the image tree"))
    }

    /// Writes the manifest and moves the image into place. Should the digest have appeared
    /// meanwhile (a concurrent build of the same recipe), that one stays and this is dropped.
    pub fn commit(self, manifest: &Manifest) -> Result<StoredImage> {
        if manifest.digest != self.digest {
            return Err(ImageError::Build(format!(
                "manifest digest {} is not the staging's {}",
                manifest.digest, self.digest
            )));
        }
        let json = serde_json::to_vec_pretty(manifest).map_err(|e| ImageError::Corrupt {
            digest: self.digest.clone(),
            why: e.to_string(),
        })?;
        std::fs::write(self.dir.join(MANIFEST), json).map_err(ImageError::io("write manifest"))?;
        self.install()
    }

    fn install(mut self) -> Result<StoredImage> {
        // Everything on disk before the rename makes it visible.
        let dir = std::fs::File::open(&self.dir).map_err(ImageError::io("open staging"))?;
        rustix::fs::syncfs(&dir).map_err(|e| ImageError::io("sync image")(io::Error::from(e)))?;
        let target = self.store.root.join(&self.digest);
        match std::fs::rename(&self.dir, &target) {
            Ok(()) => self.done = true,
            Err(e) if target.join(MANIFEST).is_file() => {
                tracing::debug!(error = %e, digest = %self.digest, "image built twice; keeping the first");
            }
            Err(e) => return Err(ImageError::io(format!("install image {}", self.digest))(e)),
        }
        self.store
            .by_digest(&self.digest)?
            .ok_or_else(|| ImageError::NotFound(self.digest.clone()))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = std::fs::remove_dir_all(&self.dir) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "remove unfinished image");
                }
            }
        }
    }
}

fn unique() -> String {
    format!(
        "{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Whether the process that made a `.tmp` entry (`<what>.<pid>.<n>`) still runs.
fn owner_alive(entry: &str) -> bool {
    let mut parts = entry.rsplit('.');
    let _n = parts.next();
    parts
        .next()
        .and_then(|pid| pid.parse::<u32>().ok())
        .is_some_and(|pid| Path::new("/proc").join(pid.to_string()).exists())
}

fn read_dir(dir: &Path) -> Result<Vec<std::fs::DirEntry>> {
    std::fs::read_dir(dir)
        .and_then(|entries| entries.collect::<io::Result<Vec<_>>>())
        .map_err(ImageError::io(format!("list {}", dir.display())))
}

fn link_or_copy(from: &Path, to: &Path) -> io::Result<()> {
    match std::fs::hard_link(from, to) {
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::XDEV.raw_os_error()) => {
            std::fs::copy(from, to)?;
            let meta = std::fs::symlink_metadata(from)?;
            lchown(to, Some(meta.uid()), Some(meta.gid()))
        }
        other => other,
    }
}

/// Recreates the tree `from` at `to`: directories with their owners and modes, symlinks as
/// they are, regular files as hard links (their inodes, owners included, shared).
fn link_tree(from: &Path, to: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(from)?;
    let ft = meta.file_type();
    if ft.is_dir() {
        std::fs::create_dir(to)?;
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            link_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        lchown(to, Some(meta.uid()), Some(meta.gid()))?;
        std::fs::set_permissions(to, meta.permissions())
    } else if ft.is_symlink() {
        symlink(std::fs::read_link(from)?, to)?;
        lchown(to, Some(meta.uid()), Some(meta.gid()))
    } else {
        link_or_copy(from, to)
    }
}

#[cfg(test)]
mod tests;
