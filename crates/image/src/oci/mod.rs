//! Importing an OCI image: an image layout tar (`index.json`, `blobs/sha256/...`) or a
//! `docker save` tar (`manifest.json`, config and `layer.tar` files), whose layers are unpacked
//! in order into a new image of the store, its manifest taken from the image config (env,
//! working directory, user, command). The archive is read in place: one pass lists where each
//! of its files lies, layers are then read from those offsets (gzip-compressed or plain).
//!
//! The image's digest is that of its config (which names every layer by the sha256 of its
//! uncompressed content, checked while unpacking), so importing the same image twice finds
//! the first. A refused or broken archive leaves nothing: the tree is built in the store's
//! staging area, which is removed on any error.

mod context;
mod unpack;

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

pub use context::check_context_archive;
pub use unpack::{LayerStats, Limits};

use crate::store::{
    check_name, digest_of, ImageError, ImageStore, Language, Manifest, StoredImage,
    MANIFEST_VERSION,
};

/// Bumped when what an import does to a tree changes, so images are imported anew.
pub const IMPORT_VERSION: u32 = 3;
/// The largest JSON document (index, manifest, config) an archive may hold.
const MAX_JSON: u64 = 4 << 20;
/// The most files the outer archive may list.
const MAX_FILES: usize = 100_000;

type Result<T> = std::result::Result<T, ImageError>;

/// What an imported image is made of: the key of its digest.
#[derive(Debug, Clone, Serialize)]
pub struct Recipe {
    pub kind: &'static str,
    pub import_version: u32,
    /// sha256 of the image config, as the archive holds it.
    pub config: String,
    /// The layers' uncompressed digests, bottom first.
    pub diff_ids: Vec<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}

/// An imported image, and whether this call unpacked it (rather than finding it).
#[derive(Debug)]
pub struct Imported {
    pub image: StoredImage,
    pub unpacked: bool,
}

/// Imports the image archive at `archive` into `store` under `name`. Blocking (it unpacks
/// the whole image); needs root (the tree's files get the owners its layers name).
pub fn import(store: &ImageStore, archive: &Path, name: &str, limits: Limits) -> Result<Imported> {
    check_name(name)?;
    let outer = Outer::open(archive)?;
    let plan = outer.plan()?;
    let config_bytes = outer.read(&plan.config, MAX_JSON)?;
    let config: ImageConfig =
        serde_json::from_slice(&config_bytes).map_err(|e| invalid(format!("image config: {e}")))?;
    if config.rootfs.diff_ids.len() != plan.layers.len() {
        return Err(invalid(format!(
            "{} layers, but the config names {}",
            plan.layers.len(),
            config.rootfs.diff_ids.len()
        )));
    }
    let recipe = Recipe {
        kind: "oci",
        import_version: IMPORT_VERSION,
        config: format!("sha256:{}", hex::encode(Sha256::digest(&config_bytes))),
        diff_ids: config.rootfs.diff_ids.clone(),
        entrypoint: config.config.entrypoint.clone().unwrap_or_default(),
        cmd: config.config.cmd.clone().unwrap_or_default(),
    };
    let digest = digest_of(&recipe).map_err(|e| invalid(e.to_string()))?;
    let unpacked = store.by_digest(&digest)?.is_none();
    if unpacked {
        unpack_image(
            store, &outer, &plan, &config, &recipe, &digest, name, limits,
        )?;
    }
    store.set_name(name, &digest)?;
    Ok(Imported {
        image: store.get(&digest)?,
        unpacked,
    })
}

#[allow(clippy::too_many_arguments)]
fn unpack_image(
    store: &ImageStore,
    outer: &Outer,
    plan: &Plan,
    config: &ImageConfig,
    recipe: &Recipe,
    digest: &str,
    name: &str,
    limits: Limits,
) -> Result<StoredImage> {
    let staging = store.staging(digest)?;
    let root = staging.rootfs();
    std::fs::create_dir(&root).map_err(ImageError::io("create the image root"))?;
    let root_fd = File::open(&root).map_err(ImageError::io("open the image root"))?;
    let mut log = String::new();
    let mut budget = unpack::Budget::new(limits);
    for (n, (layer, diff_id)) in plan.layers.iter().zip(&config.rootfs.diff_ids).enumerate() {
        let stats = unpack::unpack_layer(
            std::os::fd::AsFd::as_fd(&root_fd),
            || outer.layer(layer),
            Some(diff_id),
            &mut budget,
        )?;
        log.push_str(&format!(
            "koder: layer {}/{} {diff_id}: {} entries, {} bytes, {} whiteouts, {} dropped (devices, fifos)\n",
            n + 1,
            plan.layers.len(),
            stats.entries,
            stats.bytes,
            stats.whiteouts,
            stats.dropped
        ));
    }
    for replaced in crate::rootfs::unlink_symlinked_dirs(&root)
        .map_err(ImageError::io("check the root directories"))?
    {
        log.push_str(&format!(
            "koder: /{replaced} was no directory; replaced by an empty one\n"
        ));
    }
    let size_bytes = crate::rootfs::sanitize(&root).map_err(ImageError::io("clean the tree"))?;
    log.push_str(&format!(
        "koder: imported {name}, {} MiB\n",
        size_bytes >> 20
    ));
    std::fs::write(staging.log_path(), &log).map_err(ImageError::io("write the build log"))?;
    let manifest = Manifest {
        manifest_version: MANIFEST_VERSION,
        name: name.into(),
        digest: digest.into(),
        recipe: serde_json::to_value(recipe).map_err(|e| invalid(e.to_string()))?,
        languages: languages_in(&root),
        env: merged_env(config.config.env.as_deref().unwrap_or_default()),
        workdir: config
            .config
            .working_dir
            .clone()
            .filter(|w| w.starts_with('/'))
            .unwrap_or_else(|| "/workspace".into()),
        user: config
            .config
            .user
            .clone()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "root".into()),
        created_at: chrono::Utc::now(),
        size_bytes,
        build_log: log,
        startup: None,
    };
    staging.commit(&manifest)
}

/// The default environment with the image's `KEY=value` entries over it.
fn merged_env(image_env: &[String]) -> Vec<(String, String)> {
    let mut env = crate::default_env();
    for entry in image_env {
        let Some((key, value)) = entry.split_once('=') else {
            continue;
        };
        match env.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value.to_string(),
            None => env.push((key.to_string(), value.to_string())),
        }
    }
    env
}

/// The interpreters the tree has, bash first (the sessions' default language).
fn languages_in(root: &Path) -> Vec<Language> {
    [
        ("bash", "/bin/bash"),
        ("python", "/usr/bin/python3"),
        ("node", "/usr/bin/node"),
    ]
    .into_iter()
    .filter(|(_, at)| crate::rootfs::has_file(root, at))
    .map(|(name, interpreter)| Language {
        name: name.into(),
        interpreter: interpreter.into(),
        version: String::new(),
    })
    .collect()
}

/// The image config's fields an import uses.
#[derive(Debug, Deserialize)]
struct ImageConfig {
    #[serde(default)]
    config: RunConfig,
    rootfs: RootFs,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RunConfig {
    env: Option<Vec<String>>,
    working_dir: Option<String>,
    user: Option<String>,
    cmd: Option<Vec<String>>,
    entrypoint: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
struct RootFs {
    diff_ids: Vec<String>,
}

/// Where the config and the layers are in the outer archive.
struct Plan {
    config: String,
    layers: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerManifest {
    config: String,
    layers: Vec<String>,
}

#[derive(Deserialize)]
struct OciIndex {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
}

#[derive(Deserialize)]
struct OciManifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// The outer archive: the file and where each regular file of it lies.
struct Outer {
    file: File,
    files: HashMap<String, (u64, u64)>,
}

impl Outer {
    fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(ImageError::io("open the image archive"))?;
        let mut files = HashMap::new();
        let mut archive = tar::Archive::new(&file);
        for entry in archive.entries().map_err(unreadable)? {
            let entry = entry.map_err(unreadable)?;
            if files.len() >= MAX_FILES {
                return Err(ImageError::TooLarge(format!(
                    "the archive lists more than {MAX_FILES} files"
                )));
            }
            if entry.header().entry_type().is_file() {
                let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
                let name = name.trim_start_matches("./").to_string();
                files.insert(name, (entry.raw_file_position(), entry.size()));
            }
        }
        Ok(Self { file, files })
    }

    /// The config and layers, from `manifest.json` (docker save) or `index.json` (OCI).
    fn plan(&self) -> Result<Plan> {
        if self.files.contains_key("manifest.json") {
            let list: Vec<DockerManifest> = self.json("manifest.json")?;
            let first = list
                .into_iter()
                .next()
                .ok_or_else(|| invalid("manifest.json lists no image"))?;
            return Ok(Plan {
                config: first.config,
                layers: first.layers,
            });
        }
        if !self.files.contains_key("index.json") {
            return Err(invalid(
                "neither manifest.json (docker save) nor index.json (OCI layout) in the archive",
            ));
        }
        let mut index: OciIndex = self.json("index.json")?;
        // An index may point at a nested index (a multi-platform image): one level is followed.
        let mut descriptor = first_of(index)?;
        if descriptor.media_type.ends_with("image.index.v1+json") {
            index = self.json(&blob_path(&descriptor.digest)?)?;
            descriptor = first_of(index)?;
        }
        let manifest: OciManifest = self.json(&blob_path(&descriptor.digest)?)?;
        let layers = manifest
            .layers
            .iter()
            .map(|l| blob_path(&l.digest))
            .collect::<Result<_>>()?;
        Ok(Plan {
            config: blob_path(&manifest.config.digest)?,
            layers,
        })
    }

    fn json<T: serde::de::DeserializeOwned>(&self, name: &str) -> Result<T> {
        serde_json::from_slice(&self.read(name, MAX_JSON)?)
            .map_err(|e| invalid(format!("{name}: {e}")))
    }

    fn section(&self, name: &str) -> Result<Section<'_>> {
        let &(start, size) = self
            .files
            .get(name)
            .ok_or_else(|| invalid(format!("{name:?} is not in the archive")))?;
        Ok(Section {
            file: &self.file,
            pos: start,
            end: start + size,
        })
    }

    fn read(&self, name: &str, max: u64) -> Result<Vec<u8>> {
        let section = self.section(name)?;
        if section.end - section.pos > max {
            return Err(invalid(format!("{name} is larger than {max} bytes")));
        }
        let mut out = Vec::new();
        section
            .take(max)
            .read_to_end(&mut out)
            .map_err(unreadable)?;
        Ok(out)
    }

    /// A layer's tar stream, decompressed as its first bytes say.
    fn layer(&self, name: &str) -> Result<Box<dyn Read + '_>> {
        let section = self.section(name)?;
        let mut magic = [0u8; 4];
        let n = self
            .file
            .read_at(&mut magic, section.pos)
            .map_err(unreadable)?;
        Ok(match &magic[..n] {
            [0x1f, 0x8b, ..] => Box::new(flate2::read::GzDecoder::new(section)),
            [0x28, 0xb5, 0x2f, 0xfd] => {
                return Err(invalid(format!("{name}: zstd layers are not supported")))
            }
            _ => Box::new(section),
        })
    }
}

fn first_of(index: OciIndex) -> Result<Descriptor> {
    index
        .manifests
        .into_iter()
        .next()
        .ok_or_else(|| invalid("index.json lists no manifest"))
}

/// `blobs/<algorithm>/<hex>` of a digest, which must be a sha256 one.
fn blob_path(digest: &str) -> Result<String> {
    match digest.strip_prefix("sha256:") {
        Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(format!("blobs/sha256/{hex}"))
        }
        _ => Err(invalid(format!("unsupported digest {digest:?}"))),
    }
}

/// A file of the outer archive, read in place.
struct Section<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for Section<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = usize::try_from(self.end - self.pos).unwrap_or(usize::MAX);
        let want = buf.len().min(left);
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

fn invalid(why: impl Into<String>) -> ImageError {
    ImageError::InvalidArchive(why.into())
}

fn unreadable(e: io::Error) -> ImageError {
    invalid(format!("unreadable archive: {e}"))
}

#[cfg(any(test, feature = "test-support"))]
pub mod testing;
#[cfg(test)]
mod tests;
