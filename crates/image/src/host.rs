//! The `host` image: the host's /usr, read-only, under a generated minimal root.
//!
//! Only what programs need to run is generated or copied (accounts with a shadow file that
//! holds no password, PAM's stack for `su`, name service switch, hosts, CA certificates, the
//! dynamic linker cache, Debian's alternatives symlinks, the OpenJDKs' and R's configuration,
//! which their /usr trees link to). Nothing else of the host's /etc — its shadow file, ssh
//! keys, machine-id, private TLS keys — ever enters a sandbox.
//! Commands users expect by a name the host's Debian lacks get a shim (`python` → `python3`)
//! in a directory of the generated root that comes last in the image's PATH.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use koder_agent_protocol::init::Bind;
use koder_runtime::RuntimeError;

use crate::{default_env, Image, DEFAULT_WORKDIR, HOST};

/// Bumped whenever the generated content changes, so old trees are rebuilt (and the microVM
/// root disks made from them).
pub const HOST_IMAGE_VERSION: &str = "7";
const MARKER: &str = ".koder-image";

/// The generated root's directory of command shims, last in [`host_env`]'s PATH so that a
/// command of the same name anywhere else wins.
pub const SHIM_DIR: &str = "/opt/koder-sandbox/bin";
/// Shims as (name, target): Debian ships `python3` and no `python` unless `python-is-python3`
/// is installed, while E2B's templates and most scripts call `python`.
const SHIMS: &[(&str, &str)] = &[("python", "/usr/bin/python3")];

/// PAM's stack for util-linux's `su` and `runuser` (from the host's /usr): root becomes anyone
/// without a password (`pam_rootok`); any other account must give one, and none has any. The
/// host's own /etc/pam.d is not copied: its stacks may name the host's services (sssd,
/// systemd-logind, a password policy) that mean nothing in a sandbox.
const SU_PAM: &str = "# koder-sandbox: root becomes anyone; other accounts have no password\n\
auth     sufficient pam_rootok.so\n\
auth     required   pam_unix.so\n\
account  required   pam_unix.so\n\
session  required   pam_unix.so\n";
/// What PAM does for any service without a file of its own: nothing is allowed.
const OTHER_PAM: &str = "# koder-sandbox: services without a file of their own are refused\n\
auth     required   pam_deny.so\n\
account  required   pam_deny.so\n\
password required   pam_deny.so\n\
session  required   pam_deny.so\n";
const PAM: &[(&str, &str)] = &[
    ("su", SU_PAM),
    ("su-l", SU_PAM),
    ("runuser", SU_PAM),
    ("runuser-l", SU_PAM),
    ("other", OTHER_PAM),
];

/// The environment of the `host` image: the default one with [`SHIM_DIR`] at the end of PATH.
pub fn host_env() -> Vec<(String, String)> {
    let mut env = default_env();
    for (k, v) in &mut env {
        if k == "PATH" {
            v.push(':');
            v.push_str(SHIM_DIR);
        }
    }
    env
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
        name: HOST.into(),
        layer,
        ro_binds,
        env: host_env(),
        workdir: DEFAULT_WORKDIR.into(),
    })
}

fn build_host_layer(images_dir: &Path, layer: &Path) -> Result<(), RuntimeError> {
    let io = |what: &str| RuntimeError::io(format!("build host image: {what}"));
    let staging = images_dir.join(format!("host.staging-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    crate::rootfs::make_dirs(&staging).map_err(io("directories"))?;
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
    crate::rootfs::write_etc(&etc).map_err(io("etc"))?;
    write_pam(&etc).map_err(io("pam.d"))?;
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
        // fontconfig's configuration: without it every program drawing text (R's PNG device,
        // cairo, Pillow's fonts) complains on stderr and finds no font.
        "fonts",
        // R's configuration (Renviron with the site library path, Rprofile.site), which
        // R_HOME/etc under /usr links to.
        "R",
    ] {
        copy_public(&Path::new("/etc").join(public), &etc.join(public)).map_err(io(public))?;
    }
    for jdk in jdk_configs(Path::new("/etc")).map_err(io("java"))? {
        copy_public(&Path::new("/etc").join(&jdk), &etc.join(&jdk)).map_err(io("java"))?;
    }
    write_shims(&staging, Path::new("/")).map_err(io("shims"))?;
    std::fs::write(staging.join(MARKER), HOST_IMAGE_VERSION).map_err(io("marker"))?;
    let _ = std::fs::remove_dir_all(layer);
    std::fs::rename(&staging, layer).map_err(io("install"))
}

/// Debian's OpenJDK packages keep their configuration (`java.security`, policies, logging) in
/// `/etc/java-<version>-openjdk`, which their `conf/` under /usr links to: without it a JVM
/// stops at start-up. Public files, as shipped by the package.
fn jdk_configs(etc: &Path) -> std::io::Result<Vec<String>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(etc)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with("java-") && name.ends_with("-openjdk") {
            found.push(name);
        }
    }
    found.sort();
    Ok(found)
}

fn write_pam(etc: &Path) -> std::io::Result<()> {
    let dir = etc.join("pam.d");
    std::fs::create_dir_all(&dir)?;
    for (service, stack) in PAM {
        std::fs::write(dir.join(service), stack)?;
    }
    Ok(())
}

/// Links each shim whose target `host_root` has (a host without python3 gets no `python`).
fn write_shims(root: &Path, host_root: &Path) -> std::io::Result<()> {
    let dir = root.join(SHIM_DIR.trim_start_matches('/'));
    std::fs::create_dir_all(&dir)?;
    for (name, target) in SHIMS {
        if host_root.join(target.trim_start_matches('/')).is_file() {
            symlink(target, dir.join(name))?;
        }
    }
    Ok(())
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
        assert_eq!(
            std::fs::read_to_string(etc.join("shadow")).unwrap(),
            crate::rootfs::shadow_of(crate::rootfs::PASSWD),
            "the host's password hashes leaked into the image"
        );
        for secret in ["gshadow", "ssh", "machine-id", "ssl/private", "sudoers"] {
            assert!(!etc.join(secret).exists(), "{secret} leaked into the image");
        }
        let passwd = std::fs::read_to_string(etc.join("passwd")).unwrap();
        assert_eq!(passwd, crate::rootfs::PASSWD);
        assert!(img.ro_binds.iter().any(|b| b.target == "/usr"));
    }

    #[test]
    fn python_is_shimmed_last_in_path_when_the_host_has_python3() {
        let dir = tempfile::tempdir().unwrap();
        let img = host_image(dir.path()).unwrap();
        let shim = img
            .layer
            .join(SHIM_DIR.trim_start_matches('/'))
            .join("python");
        if Path::new("/usr/bin/python3").is_file() {
            assert_eq!(
                std::fs::read_link(&shim).unwrap(),
                Path::new("/usr/bin/python3")
            );
        }
        let path = img.env.iter().find(|(k, _)| k == "PATH").unwrap();
        assert!(path.1.ends_with(&format!(":{SHIM_DIR}")), "{}", path.1);
        assert!(path.1.starts_with("/usr/local/sbin:"), "{}", path.1);
    }

    #[test]
    fn the_openjdk_configurations_are_found() {
        let etc = tempfile::tempdir().unwrap();
        for dir in [
            "java-17-openjdk",
            "java-21-openjdk",
            "java",
            "ssl",
            "javascript-openjdk2",
        ] {
            std::fs::create_dir(etc.path().join(dir)).unwrap();
        }
        assert_eq!(
            jdk_configs(etc.path()).unwrap(),
            ["java-17-openjdk", "java-21-openjdk"]
        );
    }

    #[test]
    fn a_shim_without_its_target_is_not_made() {
        let (root, host) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        write_shims(root.path(), host.path()).unwrap();
        let dir = root.path().join(SHIM_DIR.trim_start_matches('/'));
        assert!(dir.is_dir());
        assert!(std::fs::read_dir(&dir).unwrap().next().is_none());
        std::fs::create_dir_all(host.path().join("usr/bin")).unwrap();
        std::fs::write(host.path().join("usr/bin/python3"), "").unwrap();
        let with = tempfile::tempdir().unwrap();
        write_shims(with.path(), host.path()).unwrap();
        let shim = with
            .path()
            .join(SHIM_DIR.trim_start_matches('/'))
            .join("python");
        assert_eq!(
            std::fs::read_link(shim).unwrap(),
            Path::new("/usr/bin/python3")
        );
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
