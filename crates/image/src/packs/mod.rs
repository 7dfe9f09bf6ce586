//! Language packs: images assembled from Debian's own packages with `mmdebstrap`, independent
//! of what the host has installed. A pack's recipe (suite, packages, recipe version) is hashed
//! into its digest, so a pack is built once per recipe and every later build is a look-up.

mod build;

use serde::Serialize;

pub use build::{build, BuildOptions, Built};

use crate::store::{digest_of, Language};

/// Bumped whenever what a build does to a tree changes (clean-up, generated files), so packs of
/// an older recipe are rebuilt under a new digest.
pub const RECIPE_VERSION: u32 = 3;

/// Paths dpkg leaves out of every pack: documentation nobody in a sandbox reads.
const EXCLUDED: &[&str] = &[
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
    "/usr/share/lintian/*",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pack {
    /// Python 3.11 with pip and venv (Debian bookworm).
    Python,
    /// Node.js 20 with npm and TypeScript's compiler, for TypeScript contexts (Debian trixie:
    /// bookworm ships Node 18).
    Node,
    /// Bash and GNU coreutils (Debian bookworm).
    Bash,
}

/// What a pack is built from: everything that decides its content, and nothing else (the
/// mirror it is fetched from is not part of it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recipe {
    pub recipe_version: u32,
    pub pack: &'static str,
    pub suite: &'static str,
    pub variant: &'static str,
    pub packages: Vec<&'static str>,
    pub excluded: Vec<&'static str>,
    pub languages: Vec<Language>,
}

impl Pack {
    pub const ALL: [Pack; 3] = [Pack::Python, Pack::Node, Pack::Bash];

    pub fn name(self) -> &'static str {
        match self {
            Pack::Python => "python",
            Pack::Node => "node",
            Pack::Bash => "bash",
        }
    }

    pub fn parse(name: &str) -> Option<Pack> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The name and its version tag (`python:3.11`).
    pub fn names(self) -> [String; 2] {
        let version = self.languages()[0].version.clone();
        [
            self.name().to_string(),
            format!("{}:{version}", self.name()),
        ]
    }

    fn suite(self) -> &'static str {
        match self {
            Pack::Node => "trixie",
            Pack::Python | Pack::Bash => "bookworm",
        }
    }

    fn packages(self) -> Vec<&'static str> {
        let mut packages = match self {
            Pack::Python => vec!["python3", "python3-pip", "python3-venv"],
            // TypeScript contexts strip types with the typescript package.
            Pack::Node => vec!["nodejs", "npm", "node-typescript"],
            Pack::Bash => vec!["bash", "coreutils"],
        };
        packages.push("ca-certificates");
        // The agent sets up a session's egress (network `open`/`allowlist`, image builds) with
        // the image's own `ip` and `nft`.
        packages.extend(["iproute2", "nftables"]);
        packages
    }

    /// Its languages, the pack's own first; every pack has bash (it is essential in Debian).
    fn languages(self) -> Vec<Language> {
        let lang = |name: &str, interpreter: &str, version: &str| Language {
            name: name.into(),
            interpreter: interpreter.into(),
            version: version.into(),
        };
        let bash = lang("bash", "/bin/bash", "5.2");
        match self {
            Pack::Python => vec![lang("python", "/usr/bin/python3", "3.11"), bash],
            Pack::Node => vec![lang("node", "/usr/bin/node", "20"), bash],
            Pack::Bash => vec![bash],
        }
    }

    pub fn recipe(self) -> Recipe {
        Recipe {
            recipe_version: RECIPE_VERSION,
            pack: self.name(),
            suite: self.suite(),
            // Essential packages, apt (a template's `apt` steps install with it) and the
            // requested ones: no init system.
            variant: "minbase",
            packages: self.packages(),
            excluded: EXCLUDED.to_vec(),
            languages: self.languages(),
        }
    }
}

impl Recipe {
    pub fn digest(&self) -> String {
        // A struct of strings and numbers always serializes.
        digest_of(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pack_has_its_own_stable_digest() {
        let digests: Vec<String> = Pack::ALL.iter().map(|p| p.recipe().digest()).collect();
        for d in &digests {
            assert!(crate::store::is_digest(d), "{d}");
        }
        assert_ne!(digests[0], digests[1]);
        assert_ne!(digests[1], digests[2]);
        assert_eq!(digests[0], Pack::Python.recipe().digest());
        let mut changed = Pack::Python.recipe();
        changed.packages.push("python3-numpy");
        assert_ne!(changed.digest(), digests[0]);
    }

    #[test]
    fn names_and_languages() {
        assert_eq!(Pack::parse("node"), Some(Pack::Node));
        assert_eq!(Pack::parse("../node"), None);
        assert_eq!(Pack::Python.names(), ["python", "python:3.11"]);
        for pack in Pack::ALL {
            for name in pack.names() {
                crate::store::check_name(&name).unwrap();
            }
            let langs = pack.recipe().languages;
            assert!(langs.iter().any(|l| l.name == "bash"));
        }
        assert_eq!(Pack::Node.recipe().suite, "trixie");
    }
}
