//! Building a pack: `mmdebstrap` into a staging directory of the store (in a mount namespace of
//! its own, so the /proc and /sys it mounts into the tree vanish with it, also if it is
//! killed), then the tree made safe to share, its interpreters checked, the manifest written
//! and the image moved into place.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use super::{Pack, Recipe};
use crate::store::{ImageError, ImageStore, Manifest, StoredImage};

/// The end of the build output kept in the manifest.
const LOG_TAIL: usize = 16 * 1024;

#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub mirror: String,
    /// Debian's archive keyring (it holds the keys of every current release, trixie's too).
    pub keyring: PathBuf,
    pub mmdebstrap: PathBuf,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            mirror: "http://deb.debian.org/debian".into(),
            keyring: "/usr/share/keyrings/debian-archive-keyring.gpg".into(),
            mmdebstrap: "/usr/bin/mmdebstrap".into(),
        }
    }
}

/// A pack in the store, and whether this call built it (rather than finding it).
#[derive(Debug)]
pub struct Built {
    pub image: StoredImage,
    pub built: bool,
}

/// Builds `pack` into `store` unless an image of its recipe is there already, and points the
/// pack's names at it. Minutes of blocking work the first time (downloads, dpkg); needs root.
pub fn build(store: &ImageStore, pack: Pack, opts: &BuildOptions) -> Result<Built, ImageError> {
    let recipe = pack.recipe();
    let digest = recipe.digest();
    let built = match store.by_digest(&digest)? {
        Some(_) => false,
        None => {
            build_new(store, pack, &recipe, &digest, opts)?;
            true
        }
    };
    for name in pack.names() {
        store.set_name(&name, &digest)?;
    }
    Ok(Built {
        image: store.get(&digest)?,
        built,
    })
}

fn build_new(
    store: &ImageStore,
    pack: Pack,
    recipe: &Recipe,
    digest: &str,
    opts: &BuildOptions,
) -> Result<StoredImage, ImageError> {
    if !opts.mmdebstrap.is_file() {
        return Err(ImageError::Build(format!(
            "{} is not installed (scripts/setup.sh installs mmdebstrap)",
            opts.mmdebstrap.display()
        )));
    }
    let staging = store.staging(digest)?;
    let started = Instant::now();
    run_mmdebstrap(recipe, &staging.rootfs(), &staging.log_path(), opts)?;
    let root = staging.rootfs();
    // PEP 668 would refuse `pip install --user`; a sandbox is the environment to install into.
    let _ = std::fs::remove_file(root.join("usr/lib/python3.11/EXTERNALLY-MANAGED"));
    let size_bytes = crate::rootfs::sanitize(&root).map_err(ImageError::io("clean the tree"))?;
    for lang in &recipe.languages {
        if !crate::rootfs::has_file(&root, &lang.interpreter) {
            return Err(ImageError::Build(format!(
                "the {} interpreter {} is not in the built tree",
                lang.name, lang.interpreter
            )));
        }
    }
    append_log(
        &staging.log_path(),
        &format!(
            "koder: {} built in {:.1}s, {} MiB\n",
            pack.name(),
            started.elapsed().as_secs_f64(),
            size_bytes >> 20
        ),
    );
    let recipe_json = serde_json::to_value(recipe).map_err(|e| ImageError::Build(e.to_string()))?;
    let manifest = Manifest {
        languages: recipe.languages.clone(),
        size_bytes,
        build_log: log_tail(&staging.log_path()),
        ..Manifest::new(pack.name(), digest, recipe_json)
    };
    staging.commit(&manifest)
}

fn run_mmdebstrap(
    recipe: &Recipe,
    target: &Path,
    log: &Path,
    opts: &BuildOptions,
) -> Result<(), ImageError> {
    let out = std::fs::File::create(log).map_err(ImageError::io("create build log"))?;
    let err = out.try_clone().map_err(ImageError::io("build log"))?;
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--"])
        .arg(&opts.mmdebstrap)
        .arg(format!("--variant={}", recipe.variant))
        .arg("--mode=root")
        .arg("--format=directory")
        .arg(format!("--keyring={}", opts.keyring.display()))
        .arg(format!("--include={}", recipe.packages.join(",")))
        .arg("--aptopt=Acquire::Retries \"3\"");
    for path in &recipe.excluded {
        cmd.arg(format!("--dpkgopt=path-exclude={path}"));
    }
    cmd.arg(recipe.suite)
        .arg(target)
        .arg(&opts.mirror)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let status = cmd
        .status()
        .map_err(ImageError::io("run unshare + mmdebstrap"))?;
    if status.success() {
        Ok(())
    } else {
        Err(ImageError::Build(format!(
            "mmdebstrap {} failed ({status}):\n{}",
            recipe.suite,
            log_tail(log)
        )))
    }
}

fn append_log(log: &Path, line: &str) {
    use std::io::Write as _;
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(log) {
        let _ = f.write_all(line.as_bytes());
    }
}

/// The last [`LOG_TAIL`] bytes of the log, from a line start.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let from = text.len().saturating_sub(LOG_TAIL);
    let tail = String::from_utf8_lossy(&text[from..]).into_owned();
    match (from, tail.find('\n')) {
        (0, _) | (_, None) => tail,
        (_, Some(nl)) => tail[nl + 1..].to_string(),
    }
}
