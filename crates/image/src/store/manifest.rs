//! An image's manifest: what it is (its build inputs and their digest), what it offers (languages
//! and their interpreters, environment, working directory, user) and how it came to be (build
//! log, time, size). Written once, with the tree, and never changed: names live beside it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// Bumped when the manifest's shape changes incompatibly.
pub const MANIFEST_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub manifest_version: u32,
    /// The name it was built under.
    pub name: String,
    /// sha256 of `recipe` (64 hex digits): the store's key.
    pub digest: String,
    /// The build inputs, as hashed.
    pub recipe: serde_json::Value,
    /// Languages sessions on it can run, the first the default.
    pub languages: Vec<Language>,
    pub env: Vec<(String, String)>,
    pub workdir: String,
    pub user: String,
    pub created_at: DateTime<Utc>,
    /// Bytes of the root tree.
    pub size_bytes: u64,
    /// The end of the build's output (the whole log is `build.log` beside the manifest).
    pub build_log: String,
    /// What every new session on it runs before it is handed out (a template's start and
    /// ready commands).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup: Option<Startup>,
}

/// A template's start command (run in the background inside each new session) and the ready
/// command that gates the session's hand-out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Startup {
    pub start: String,
    /// Retried until it exits 0, for at most `ready_timeout_s`; none: handed out at once.
    pub ready: Option<String>,
    pub ready_timeout_s: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Language {
    /// Canonical language name (`python`, `node`, `bash`).
    pub name: String,
    /// Absolute path of its interpreter inside the image.
    pub interpreter: String,
    /// Its version, as the recipe pins it (`3.11`).
    pub version: String,
}

impl Manifest {
    /// A manifest with the store's defaults, made now: the default environment, working
    /// directory `/workspace`, user root, no languages, no start command, an empty log.
    /// Builders set what their recipe decides over it.
    pub fn new(name: &str, digest: &str, recipe: serde_json::Value) -> Self {
        Manifest {
            manifest_version: MANIFEST_VERSION,
            name: name.into(),
            digest: digest.into(),
            recipe,
            languages: Vec::new(),
            env: crate::default_env(),
            workdir: crate::DEFAULT_WORKDIR.into(),
            user: "root".into(),
            created_at: chrono::Utc::now(),
            size_bytes: 0,
            build_log: String::new(),
            startup: None,
        }
    }

    pub fn language(&self, name: &str) -> Option<&Language> {
        self.languages.iter().find(|l| l.name == name)
    }
}

/// The digest of a recipe: sha256 of its JSON (serde writes struct fields in declaration
/// order, so equal recipes hash alike).
pub fn digest_of<T: Serialize>(recipe: &T) -> Result<String, serde_json::Error> {
    Ok(hex::encode(Sha256::digest(serde_json::to_vec(recipe)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct R<'a> {
        suite: &'a str,
        packages: &'a [&'a str],
    }

    #[test]
    fn digest_follows_every_input() {
        let a = digest_of(&R {
            suite: "bookworm",
            packages: &["python3"],
        })
        .unwrap();
        assert_eq!(a.len(), 64);
        assert!(super::super::name::is_digest(&a));
        let same = digest_of(&R {
            suite: "bookworm",
            packages: &["python3"],
        })
        .unwrap();
        assert_eq!(a, same);
        for other in [
            R {
                suite: "trixie",
                packages: &["python3"],
            },
            R {
                suite: "bookworm",
                packages: &["python3", "python3-pip"],
            },
        ] {
            assert_ne!(a, digest_of(&other).unwrap());
        }
    }
}
