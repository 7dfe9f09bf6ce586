//! Which image a session runs on, and what keeps an image from being deleted under it.
//!
//! A create names an image (`"image"`), or a language whose pack is configured
//! (`[images] language_packs`), or neither (`host`). The image is resolved to its digest and
//! *pinned* from then until the session's record is in the store; a delete marks the digest
//! first (new creates then miss it), then looks for pins and for unstopped sessions naming an
//! image of that digest. So every create either holds a pin the delete sees, or has a record
//! the delete's query finds, or starts after the mark and is refused.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use koder_api_types as api;
use koder_image::{ImageError, ImageStore, StoredImage, HOST};
use parking_lot::Mutex;

use crate::languages::{self, DEFAULT_LANGUAGE};
use crate::Error;

pub struct Images {
    store: Option<ImageStore>,
    /// language → image its sessions run on when they name none.
    language_packs: BTreeMap<String, String>,
    state: Arc<Mutex<Uses>>,
}

#[derive(Default)]
struct Uses {
    /// Creates between resolving a digest and recording their session.
    pins: HashMap<String, usize>,
    /// Digests being deleted.
    deleting: HashSet<String>,
}

/// What a create runs on.
pub struct Choice {
    /// As recorded with the session: `host` or the name the image was chosen by.
    pub name: String,
    /// What the runtime gets: `host`, or the digest (the very image that was checked).
    pub spec_image: String,
    pub language: &'static str,
    /// Held until the session is recorded.
    pub pin: Option<Pin>,
    /// The image's start and ready commands, run before a cold sandbox is handed out.
    pub(crate) prepare: Option<Arc<crate::startup::Prepare>>,
}

impl Choice {
    /// The build a session on it records: its digest, `None` for `host`.
    pub fn build(&self) -> Option<String> {
        (self.spec_image != HOST).then(|| self.spec_image.clone())
    }
}

pub struct Pin {
    digest: String,
    state: Arc<Mutex<Uses>>,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut uses = self.state.lock();
        if let Some(n) = uses.pins.get_mut(&self.digest) {
            *n -= 1;
            if *n == 0 {
                uses.pins.remove(&self.digest);
            }
        }
    }
}

/// Marks a digest as being deleted until dropped.
pub struct Deleting {
    digest: String,
    state: Arc<Mutex<Uses>>,
}

impl Drop for Deleting {
    fn drop(&mut self) {
        self.state.lock().deleting.remove(&self.digest);
    }
}

impl Images {
    /// Checks the configured language packs: languages must be known and names valid (a pack
    /// not built yet is only a warning: creates then say how to build it).
    pub fn new(
        store: Option<ImageStore>,
        language_packs: &BTreeMap<String, String>,
    ) -> Result<Self, Error> {
        let mut packs = BTreeMap::new();
        for (language, image) in language_packs {
            let language = languages::canonical(language)?;
            if image != HOST {
                koder_image::store::check_name(image).map_err(image_error)?;
                let found = store.as_ref().map(|s| s.get(image));
                if !matches!(found, Some(Ok(_))) {
                    tracing::warn!(%language, %image, "configured language pack is not built (ksandbox image build {image})");
                }
            }
            packs.insert(language.to_string(), image.clone());
        }
        Ok(Self {
            store,
            language_packs: packs,
            state: Arc::default(),
        })
    }

    /// The image each language's warm sandboxes run on.
    pub fn pool_images(&self) -> BTreeMap<String, String> {
        self.language_packs.clone()
    }

    /// The start and ready commands of each language's warm-pool image that has them.
    pub(crate) fn pool_startups(&self) -> BTreeMap<String, Arc<crate::startup::Prepare>> {
        self.language_packs
            .iter()
            .filter(|(_, image)| image.as_str() != HOST)
            .filter_map(|(language, image)| {
                let found = self.store.as_ref()?.get(image).ok()?;
                Some((language.clone(), crate::startup::Prepare::of(&found)?))
            })
            .collect()
    }

    /// The image a language's sessions get when they name none.
    pub(crate) fn default_for(&self, language: &str) -> &str {
        self.language_packs
            .get(language)
            .map_or(HOST, String::as_str)
    }

    /// The image and language of a create, the image pinned.
    pub fn choose(&self, image: Option<&str>, language: Option<&str>) -> Result<Choice, Error> {
        let language = language.map(languages::canonical).transpose()?;
        let name = match image {
            Some(name) => name.to_string(),
            None => self
                .default_for(language.unwrap_or(DEFAULT_LANGUAGE))
                .to_string(),
        };
        if name == HOST {
            return Ok(Choice {
                name,
                spec_image: HOST.into(),
                language: language.unwrap_or(DEFAULT_LANGUAGE),
                pin: None,
                prepare: None,
            });
        }
        let found = self.lookup(&name)?;
        let language = match language {
            Some(l) if found.manifest.language(l).is_some() => l,
            Some(l) => {
                return Err(Error::InvalidArgument(format!(
                    "image {name:?} has no {l}; its languages: {}",
                    language_names(&found)
                )))
            }
            None => found
                .manifest
                .languages
                .first()
                .map(|l| languages::canonical(&l.name))
                .transpose()?
                .unwrap_or(DEFAULT_LANGUAGE),
        };
        let digest = found.manifest.digest.clone();
        let pin = {
            let mut uses = self.state.lock();
            if uses.deleting.contains(&digest) {
                return Err(Error::ImageNotFound(format!(
                    "image {name:?} is being deleted"
                )));
            }
            *uses.pins.entry(digest.clone()).or_default() += 1;
            Pin {
                digest: digest.clone(),
                state: self.state.clone(),
            }
        };
        Ok(Choice {
            name,
            spec_image: digest,
            language,
            pin: Some(pin),
            prepare: crate::startup::Prepare::of(&found),
        })
    }

    /// The image `name` at the build `digest` a session or snapshot recorded, pinned: that very
    /// build while the store holds it (its name may point at a newer one by now: a resumed,
    /// restored or forked session keeps the files it had), else whatever `name` is now (a
    /// record from before builds were kept, or from a node whose store has another build).
    pub fn choose_build(
        &self,
        name: &str,
        digest: Option<&str>,
        language: Option<&str>,
    ) -> Result<Choice, Error> {
        let held = (self.store.as_ref().zip(digest))
            .filter(|(s, d)| matches!(s.by_digest(d), Ok(Some(_))));
        match held {
            Some((_, digest)) => Ok(Choice {
                name: name.to_string(),
                ..self.choose(Some(digest), language)?
            }),
            None => self.choose(Some(name), language),
        }
    }

    /// An image of the store, by name or digest.
    pub fn lookup(&self, name: &str) -> Result<StoredImage, Error> {
        let Some(store) = &self.store else {
            return Err(Error::ImageNotFound(format!(
                "no image {name:?}: this server has only the host image"
            )));
        };
        store.get(name).map_err(|e| match e {
            ImageError::NotFound(_) => Error::ImageNotFound(format!(
                "no image {name:?} on this server (GET /v1/sandbox/images lists them; `ksandbox image build python|node|bash` builds a language pack)"
            )),
            other => image_error(other),
        })
    }

    /// The digest an image name resolves to now, if any.
    pub fn digest_of(&self, name: &str) -> Option<String> {
        if name == HOST {
            return None;
        }
        self.store
            .as_ref()
            .and_then(|s| s.get(name).ok())
            .map(|i| i.manifest.digest)
    }

    /// Marks `digest` as being deleted; refused while a create holds it.
    pub fn start_delete(&self, digest: &str) -> Result<Deleting, Error> {
        let mut uses = self.state.lock();
        if uses.pins.contains_key(digest) {
            return Err(Error::ImageInUse(
                "a session is being created on this image".into(),
            ));
        }
        if !uses.deleting.insert(digest.to_string()) {
            return Err(Error::ImageInUse("the image is being deleted".into()));
        }
        Ok(Deleting {
            digest: digest.to_string(),
            state: self.state.clone(),
        })
    }

    pub fn store(&self) -> Option<&ImageStore> {
        self.store.as_ref()
    }

    /// The configured languages whose warm pools run on `digest`.
    pub fn pooled_languages(&self, digest: &str) -> Vec<String> {
        self.language_packs
            .iter()
            .filter(|(_, image)| self.digest_of(image).as_deref() == Some(digest))
            .map(|(language, _)| language.clone())
            .collect()
    }
}

fn language_names(image: &StoredImage) -> String {
    image
        .manifest
        .languages
        .iter()
        .map(|l| l.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn image_error(e: ImageError) -> Error {
    match e {
        ImageError::NotFound(name) => Error::ImageNotFound(format!("image {name:?} not found")),
        ImageError::InvalidName(why) => Error::InvalidArgument(format!("invalid image name {why}")),
        other => Error::Internal(other.to_string()),
    }
}

/// The API view of a stored image.
pub fn view(image: &StoredImage, in_use: bool, with_log: bool) -> api::Image {
    let m = &image.manifest;
    api::Image {
        name: image
            .names
            .first()
            .cloned()
            .unwrap_or_else(|| m.name.clone()),
        names: image.names.clone(),
        digest: Some(m.digest.clone()),
        // Imports and builds say what they are in their recipe; packs' recipes predate that.
        kind: m
            .recipe
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or("pack")
            .into(),
        languages: m
            .languages
            .iter()
            .map(|l| api::ImageLanguage {
                name: l.name.clone(),
                interpreter: l.interpreter.clone(),
                version: Some(l.version.clone()),
            })
            .collect(),
        env: m.env.iter().cloned().collect(),
        workdir: m.workdir.clone(),
        user: m.user.clone(),
        created_at: Some(m.created_at),
        size_bytes: Some(m.size_bytes),
        recipe: Some(m.recipe.clone()),
        build_log: with_log.then(|| m.build_log.clone()),
        in_use,
    }
}

/// The API view of `host`: the host's interpreters, wherever PATH finds them.
pub fn host_view() -> api::Image {
    let lang = |name: &str, interpreter: &str| api::ImageLanguage {
        name: name.into(),
        interpreter: interpreter.into(),
        version: None,
    };
    api::Image {
        name: HOST.into(),
        names: vec![HOST.into()],
        digest: None,
        kind: HOST.into(),
        languages: vec![
            lang("bash", "/bin/bash"),
            lang("python", "/usr/bin/python3"),
            lang("node", "/usr/bin/node"),
        ],
        env: koder_image::host_env().into_iter().collect(),
        workdir: "/workspace".into(),
        user: "root".into(),
        created_at: None,
        size_bytes: None,
        recipe: None,
        build_log: None,
        in_use: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_with(names: &[&str]) -> (tempfile::TempDir, ImageStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        for name in names {
            let digest = koder_image::store::digest_of(name).unwrap();
            let staging = store.staging(&digest).unwrap();
            std::fs::create_dir_all(staging.rootfs()).unwrap();
            let manifest = koder_image::Manifest {
                languages: vec![
                    koder_image::store::Language {
                        name: name.to_string(),
                        interpreter: format!("/usr/bin/{name}"),
                        version: "1".into(),
                    },
                    koder_image::store::Language {
                        name: "bash".into(),
                        interpreter: "/bin/bash".into(),
                        version: "5".into(),
                    },
                ],
                ..koder_image::Manifest::new(name, &digest, serde_json::json!({}))
            };
            staging.commit(&manifest).unwrap();
            store.set_name(name, &digest).unwrap();
        }
        (dir, store)
    }

    #[test]
    fn language_packs_pick_the_image_and_images_pick_the_language() {
        let (_dir, store) = store_with(&["python"]);
        let packs = [("py".to_string(), "python".to_string())].into();
        let images = Images::new(Some(store), &packs).unwrap();
        let c = images.choose(None, Some("python")).unwrap();
        assert_eq!((c.name.as_str(), c.language), ("python", "python"));
        assert!(c.spec_image.len() == 64 && c.pin.is_some());
        let c = images.choose(Some("python"), None).unwrap();
        assert_eq!(c.language, "python", "the image's first language");
        let c = images.choose(Some("python"), Some("bash")).unwrap();
        assert_eq!(c.language, "bash");
        let c = images.choose(None, Some("node")).unwrap();
        assert_eq!((c.name.as_str(), c.spec_image.as_str()), ("host", "host"));
        assert!(matches!(
            images.choose(Some("python"), Some("node")),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            images.choose(Some("ruby"), None),
            Err(Error::ImageNotFound(_))
        ));
        assert!(matches!(
            images.choose(Some("../x"), None),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn a_pinned_image_cannot_start_deleting_and_a_deleting_one_cannot_be_chosen() {
        let (_dir, store) = store_with(&["python"]);
        let images = Images::new(Some(store), &BTreeMap::new()).unwrap();
        let c = images.choose(Some("python"), None).unwrap();
        let digest = c.spec_image.clone();
        assert!(matches!(
            images.start_delete(&digest),
            Err(Error::ImageInUse(_))
        ));
        drop(c);
        let deleting = images.start_delete(&digest).unwrap();
        assert!(matches!(
            images.choose(Some("python"), None),
            Err(Error::ImageNotFound(_))
        ));
        drop(deleting);
        images.choose(Some("python"), None).unwrap();
    }

    #[test]
    fn a_recorded_build_is_chosen_while_the_store_holds_it_else_the_name() {
        let (_dir, store) = store_with(&["python", "node"]);
        let images = Images::new(Some(store.clone()), &BTreeMap::new()).unwrap();
        let first = images.digest_of("python").unwrap();
        let newer = images.digest_of("node").unwrap();
        // The name moves on: the first build is unnamed but still stored.
        store.set_name("python", &newer).unwrap();
        let c = images
            .choose_build("python", Some(&first), Some("bash"))
            .unwrap();
        assert_eq!(
            (c.name.as_str(), c.spec_image.as_str()),
            ("python", &*first)
        );
        assert!(
            matches!(images.start_delete(&first), Err(Error::ImageInUse(_))),
            "the recorded build is pinned like a chosen one"
        );
        drop(c);
        for gone in [Some("f".repeat(64)), Some("../etc".into()), None] {
            let c = images
                .choose_build("python", gone.as_deref(), Some("bash"))
                .unwrap();
            assert_eq!(
                (c.name.as_str(), c.spec_image.as_str()),
                ("python", &*newer)
            );
        }
    }

    #[test]
    fn bad_pack_config_is_refused() {
        let bad_language = [("cobol".to_string(), "python".to_string())].into();
        assert!(Images::new(None, &bad_language).is_err());
        let bad_name = [("python".to_string(), "../etc".to_string())].into();
        assert!(Images::new(None, &bad_name).is_err());
        let images = Images::new(None, &BTreeMap::new()).unwrap();
        assert!(matches!(
            images.choose(Some("python"), None),
            Err(Error::ImageNotFound(_))
        ));
    }
}
