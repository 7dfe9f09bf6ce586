//! The `host` image: the host's /usr, read-only, under a generated minimal root.
//!
//! Only what programs need to run is generated or copied (accounts, name service switch, hosts,
//! CA certificates, the dynamic linker cache, Debian's alternatives symlinks). Nothing else of
//! the host's /etc — shadow, ssh keys, machine-id, private TLS keys — ever enters a sandbox.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use koder_agent_protocol::init::Bind;
use koder_runtime::RuntimeError;

/// Bumped whenever the generated content changes, so old trees are rebuilt.
const HOST_IMAGE_VERSION: &str = "2";
const MARKER: &str = ".koder-image";

/// A ready-to-mount image: the lower layer and the host paths bound read-only over it.
#[derive(Debug, Clone)]
pub struct Image {
    pub name: String,
    pub layer: PathBuf,
    pub ro_binds: Vec<Bind>,
    pub env: Vec<(String, String)>,
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

const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
user:x:1000:1000:user:/home/user:/bin/bash\n\
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const GROUP: &str = "root:x:0:\ntty:x:5:\nuser:x:1000:\nnogroup:x:65534:\n";
const HOSTS: &str = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n";
const NSSWITCH: &str = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n";
const RESOLV: &str = "# koder-sandbox: name resolution follows the session's network policy\n";

/// Checks that a sandbox spec names an image this host has (`host`; empty means `host`).
pub fn require_known(name: &str) -> Result<(), RuntimeError> {
    if name.is_empty() || name == "host" {
        Ok(())
    } else {
        Err(RuntimeError::InvalidSpec(format!(
            "unknown image {name:?}; available: host"
        )))
    }
}

/// Builds (once per version) and returns the `host` image under `images_dir`.
pub fn host_image(images_dir: &Path) -> Result<Image, RuntimeError> {
    let layer = images_dir.join("host");
    let marker = layer.join(MARKER);
    if std::fs::read_to_string(&marker).ok().as_deref() != Some(HOST_IMAGE_VERSION) {
        build_host_layer(images_dir, &layer)?;
    }
    let mut ro_binds = vec![Bind {
        source: "/usr".into(),
        target: "/usr".into(),
    }];
    ro_binds.retain(|b| Path::new(&b.source).is_dir());
    Ok(Image {
        name: "host".into(),
        layer,
        ro_binds,
        env: default_env(),
    })
}

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

fn build_host_layer(images_dir: &Path, layer: &Path) -> Result<(), RuntimeError> {
    let io = |what: &str| RuntimeError::io(format!("build host image: {what}"));
    let staging = images_dir.join(format!("host.staging-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    for dir in ROOT_DIRS {
        std::fs::create_dir_all(staging.join(dir)).map_err(io(dir))?;
    }
    for dir in ["tmp", "var/tmp"] {
        std::fs::set_permissions(staging.join(dir), std::fs::Permissions::from_mode(0o1777))
            .map_err(io(dir))?;
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("lib32", "usr/lib32"),
    ] {
        if Path::new("/usr")
            .join(target.trim_start_matches("usr/"))
            .exists()
        {
            symlink(target, staging.join(link)).map_err(io(link))?;
        }
    }
    let etc = staging.join("etc");
    for (name, content) in [
        ("passwd", PASSWD),
        ("group", GROUP),
        ("hosts", HOSTS),
        ("nsswitch.conf", NSSWITCH),
        ("resolv.conf", RESOLV),
        ("hostname", "sandbox\n"),
    ] {
        std::fs::write(etc.join(name), content).map_err(io(name))?;
    }
    symlink("/usr/share/zoneinfo/Etc/UTC", etc.join("localtime")).map_err(io("localtime"))?;
    symlink("../usr/lib/os-release", etc.join("os-release")).map_err(io("os-release"))?;
    for public in [
        "ssl/certs",
        "ssl/openssl.cnf",
        "ca-certificates.conf",
        "alternatives",
        "ld.so.cache",
        "ld.so.conf",
        "ld.so.conf.d",
        "matplotlibrc",
    ] {
        copy_public(&Path::new("/etc").join(public), &etc.join(public)).map_err(io(public))?;
    }
    std::fs::write(staging.join(MARKER), HOST_IMAGE_VERSION).map_err(io("marker"))?;
    let _ = std::fs::remove_dir_all(layer);
    std::fs::rename(&staging, layer).map_err(io("install"))
}

/// Copies a public host file or tree (regular files and symlinks only; anything else, such as
/// sockets or devices, is skipped). Missing sources are fine: not every host has every file.
fn copy_public(src: &Path, dst: &Path) -> std::io::Result<()> {
    let meta = match std::fs::symlink_metadata(src) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let ft = meta.file_type();
    if ft.is_symlink() {
        symlink(std::fs::read_link(src)?, dst)
    } else if ft.is_dir() {
        std::fs::create_dir_all(dst)?;
        for entry in std::fs::read_dir(src)? {
            let entry = entry?;
            copy_public(&entry.path(), &dst.join(entry.file_name()))?;
        }
        Ok(())
    } else if ft.is_file() {
        std::fs::copy(src, dst)?;
        std::fs::set_permissions(dst, std::fs::Permissions::from_mode(0o644))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_image_has_no_host_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let img = host_image(dir.path()).unwrap();
        let etc = img.layer.join("etc");
        assert!(etc.join("passwd").is_file());
        for secret in [
            "shadow",
            "gshadow",
            "ssh",
            "machine-id",
            "ssl/private",
            "sudoers",
        ] {
            assert!(!etc.join(secret).exists(), "{secret} leaked into the image");
        }
        let passwd = std::fs::read_to_string(etc.join("passwd")).unwrap();
        assert_eq!(passwd, PASSWD);
        assert!(img.ro_binds.iter().any(|b| b.target == "/usr"));
    }

    #[test]
    fn image_is_built_once_per_version() {
        let dir = tempfile::tempdir().unwrap();
        let first = host_image(dir.path()).unwrap();
        std::fs::write(first.layer.join("etc/extra"), "x").unwrap();
        let second = host_image(dir.path()).unwrap();
        assert!(
            second.layer.join("etc/extra").exists(),
            "rebuilt without need"
        );
        std::fs::write(first.layer.join(MARKER), "0").unwrap();
        let third = host_image(dir.path()).unwrap();
        assert!(!third.layer.join("etc/extra").exists(), "stale image kept");
    }
}
