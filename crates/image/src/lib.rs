//! Sandbox images: the read-only root trees sandboxes are made of.
//!
//! In phases that only import downwards: [`host`] (the generated `host` image: the host's
//! /usr under a minimal root), [`packs`] (language packs assembled from Debian's packages with
//! `mmdebstrap`) → [`store`] (content-addressed images on disk: a root tree plus a manifest,
//! under names, installed atomically) → `rootfs` (what every root tree gets: its directories,
//! the generated accounts and resolver files, and the clean-up that makes a tree safe to share
//! read-only among sandboxes).

mod host;
pub mod oci;
pub mod packs;
pub mod plan;
mod rootfs;
pub mod store;
pub mod template;

use std::path::PathBuf;

use koder_agent_protocol::init::Bind;
use koder_runtime::RuntimeError;

pub use host::{host_env, host_image, HOST_IMAGE_VERSION, SHIM_DIR};
pub use rootfs::{account_in_tree, find_account, valid_name as valid_account_name, Account};
pub use store::{ImageError, ImageStore, Manifest, StoredImage};

/// The image every host has: its own /usr under a generated root.
pub const HOST: &str = "host";
/// Where execs start on the host image (and on images that name no directory of their own).
pub const DEFAULT_WORKDIR: &str = "/workspace";

/// A ready-to-mount image: the lower layer and the host paths bound read-only over it.
#[derive(Debug, Clone)]
pub struct Image {
    pub name: String,
    pub layer: PathBuf,
    pub ro_binds: Vec<Bind>,
    pub env: Vec<(String, String)>,
    /// Where execs start (and the agent starts).
    pub workdir: String,
}

/// Directories every image root has; the writable ones are pre-created per session in the upper
/// layer, owned by the sandbox's root, since the image's own copies belong to the host.
pub const ROOT_DIRS: &[&str] = &[
    "usr",
    "etc",
    "proc",
    "dev",
    "tmp",
    "workspace",
    "root",
    "home",
    "home/user",
    "var",
    "var/tmp",
    "run",
    "opt",
    "mnt",
    "srv",
];

/// Directories created in each session's upper layer, owned by the sandbox's root, so that
/// sandbox code can write below them although the image's copies belong to the host.
pub const UPPER_DIRS: &[&str] = &[
    "workspace",
    "root",
    "home",
    "tmp",
    "var",
    "var/tmp",
    "run",
    "opt",
    "mnt",
    "srv",
];

/// In-sandbox directories that sandbox code may write below.
pub const WRITABLE_DIRS: &[&str] = &[
    "/workspace",
    "/tmp",
    "/root",
    "/home",
    "/var",
    "/run",
    "/opt",
    "/mnt",
    "/srv",
    "/dev",
    "/proc",
];

/// The directories a session on the image `name` (working directory `workdir`) may write
/// below. A store image's root is the sandbox's own — its files are the sandbox's users' and
/// every change lands in the session's upper layer —, so all of it, as in a container (`mkdir
/// /app`, a system-wide `pip install`). The host image's lower layers are the host's own
/// directories, bound read-only with owners the sandbox cannot map: [`WRITABLE_DIRS`] and the
/// working directory (unless it is the root), Landlock standing behind those walls.
pub fn writable_dirs(name: &str, workdir: &str) -> Vec<String> {
    if !is_host(name) {
        return vec!["/".into()];
    }
    WRITABLE_DIRS
        .iter()
        .map(|d| d.to_string())
        .chain(Some(workdir.to_string()).filter(|w| w != "/"))
        .collect()
}

/// The image a sandbox spec names: `host` (or empty) is `host`, anything else is looked up in
/// `store` (a name, or a digest). An image this host lacks is an invalid spec.
pub fn resolve(
    host: &Image,
    store: Option<&ImageStore>,
    name: &str,
) -> Result<Image, RuntimeError> {
    if is_host(name) {
        return Ok(host.clone());
    }
    find(store, name).map(|found| found.image())
}

/// Whether a sandbox spec's image name means `host` (empty does).
pub fn is_host(name: &str) -> bool {
    name.is_empty() || name == HOST
}

/// The store image a sandbox spec names (a name, or a digest); one this host lacks is an
/// invalid spec.
pub fn find(store: Option<&ImageStore>, name: &str) -> Result<StoredImage, RuntimeError> {
    let Some(store) = store else {
        return Err(RuntimeError::InvalidSpec(format!(
            "unknown image {name:?}: this runtime has no image store"
        )));
    };
    match store.get(name) {
        Ok(found) => Ok(found),
        Err(e @ (ImageError::NotFound(_) | ImageError::InvalidName(_))) => {
            Err(RuntimeError::InvalidSpec(e.to_string()))
        }
        Err(e) => Err(RuntimeError::Start(format!("image {name:?}: {e}"))),
    }
}

/// The environment every image starts from (an image's manifest may add to it).
pub fn default_env() -> Vec<(String, String)> {
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", "/root"),
        ("USER", "root"),
        ("LANG", "C.UTF-8"),
        ("HOSTNAME", "sandbox"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_images_write_their_whole_root_the_host_image_its_usual_dirs() {
        assert_eq!(writable_dirs("python", "/workspace"), ["/"]);
        assert_eq!(writable_dirs("sha256:ab", "/app"), ["/"]);
        for host in ["host", ""] {
            assert_eq!(
                writable_dirs(host, "/workspace"),
                WRITABLE_DIRS
                    .iter()
                    .chain(&["/workspace"])
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
            );
            assert_eq!(
                writable_dirs(host, "/app").last().map(String::as_str),
                Some("/app")
            );
            assert!(!writable_dirs(host, "/").iter().any(|d| d == "/"));
        }
    }
}
