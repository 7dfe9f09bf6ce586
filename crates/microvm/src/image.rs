//! The microVM image: a guest kernel with its boot modules and a read-only ext4 root disk made
//! from the same `host` image the jail runtime uses. Built once by `ksandbox image build`
//! (minutes: it unpacks a kernel package and writes a few GiB), then shared read-only by every
//! VM; each VM's writes go to its own scratch disk. (Store images get their root disks from
//! [`crate::disk`]; they share this kernel.)

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::kernel::{self, EGRESS_MODULES, GUEST_MODULES, VOLUME_MODULES};

/// Bumped when the image layout or content rules change, so old images are rebuilt.
pub const IMAGE_VERSION: u32 = 4;
const MANIFEST: &str = "manifest.json";

/// Large trees of the host's /usr a sandbox's languages do not use; the guest's root disk
/// would be twice the size with them. (The jail, which binds /usr, has them all.)
pub const USR_EXCLUDED: &[&str] = &[
    "lib/google-cloud-sdk",
    "lib/jvm",
    "lib/llvm-14",
    "lib/llvm-15",
    "lib/llvm-16",
    "lib/postgresql",
    "share/doc",
    "share/man",
    "share/locale",
    "share/info",
    "include",
];

/// Debian's meta package naming the current cloud kernel.
const KERNEL_META_PACKAGE: &str = "linux-image-cloud-amd64";

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("the microvm image is not built in {0}; run `ksandbox image build --images-dir <dir>` (scripts/setup-microvm.sh installs its tools)")]
    NotBuilt(String),
    #[error("{0}")]
    Kernel(#[from] kernel::KernelError),
    /// A store image's tree holding what no store tree does (see `disk`).
    #[error("refusing to make a root disk of this image: {0}")]
    UnsafeTree(String),
    #[error("{what} failed: {detail}")]
    Tool { what: String, detail: String },
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ImageError {
    let what = what.into();
    move |e| ImageError::Io(what, e)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Manifest {
    version: u32,
    /// The `host` image's version the root disk was made from: a newer one (its generated
    /// /etc changed) makes the image stale. Absent in manifests from before it was recorded.
    #[serde(default)]
    host_image: String,
    kernel_version: String,
    /// Module names in load order; the files are `modules/<name>.ko`.
    modules: Vec<String>,
    /// Loaded after `modules` in guests with egress.
    egress_modules: Vec<String>,
    /// Loaded after `modules` in guests that mount volumes.
    volume_modules: Vec<String>,
}

/// A built image, ready to boot.
#[derive(Debug, Clone)]
pub struct VmImage {
    pub dir: PathBuf,
    pub kernel_version: String,
    /// Uncompressed ELF kernel (PVH entry): QEMU and Firecracker boot it directly.
    pub vmlinux: PathBuf,
    pub rootfs: PathBuf,
    /// (module name, file) in load order.
    pub modules: Vec<(String, PathBuf)>,
    /// Loaded after `modules` when the guest has egress.
    pub egress_modules: Vec<(String, PathBuf)>,
    /// Loaded after `modules` when the guest mounts volumes.
    pub volume_modules: Vec<(String, PathBuf)>,
}

/// Where the image lives under an images directory.
pub fn image_dir(images_dir: &Path) -> PathBuf {
    images_dir.join("microvm")
}

/// Loads a built image; `NotBuilt` when there is none of this version.
pub fn load(images_dir: &Path) -> Result<VmImage, ImageError> {
    let dir = image_dir(images_dir);
    let shown = dir.display().to_string();
    let not_built = || ImageError::NotBuilt(shown.clone());
    let raw = std::fs::read(dir.join(MANIFEST)).map_err(|_| not_built())?;
    let manifest: Manifest = serde_json::from_slice(&raw).map_err(|_| not_built())?;
    if manifest.version != IMAGE_VERSION || manifest.host_image != koder_image::HOST_IMAGE_VERSION {
        return Err(not_built());
    }
    let files = |names: &[String]| -> Vec<(String, PathBuf)> {
        names
            .iter()
            .map(|m| (m.clone(), dir.join("modules").join(format!("{m}.ko"))))
            .collect()
    };
    let image = VmImage {
        vmlinux: dir.join("vmlinux"),
        rootfs: dir.join("rootfs.ext4"),
        modules: files(&manifest.modules),
        egress_modules: files(&manifest.egress_modules),
        volume_modules: files(&manifest.volume_modules),
        kernel_version: manifest.kernel_version,
        dir,
    };
    let complete = [&image.vmlinux, &image.rootfs]
        .into_iter()
        .chain(
            image
                .modules
                .iter()
                .chain(&image.egress_modules)
                .chain(&image.volume_modules)
                .map(|(_, p)| p),
        )
        .all(|p| p.is_file());
    if complete {
        Ok(image)
    } else {
        Err(not_built())
    }
}

/// What to build from.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub images_dir: PathBuf,
    /// A `linux-image-*` .deb to use instead of downloading Debian's current cloud kernel.
    pub kernel_deb: Option<PathBuf>,
    /// Rebuild even when an image of this version exists.
    pub force: bool,
}

/// Builds the image (kernel, modules, root disk) unless one of this version exists. Needs
/// root (the root disk is made in a private mount namespace), `dpkg-deb`, `mkfs.ext4` and, without
/// `kernel_deb`, `apt-get`.
pub fn build(opts: &BuildOptions) -> Result<VmImage, ImageError> {
    if !opts.force {
        if let Ok(image) = load(&opts.images_dir) {
            return Ok(image);
        }
    }
    let dir = image_dir(&opts.images_dir);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("modules"))
        .map_err(io(format!("create {}", dir.display())))?;
    let work = tempdir_in(&opts.images_dir)?;
    let result = build_into(opts, &dir, &work);
    let _ = std::fs::remove_dir_all(&work);
    result?;
    load(&opts.images_dir)
}

fn build_into(opts: &BuildOptions, dir: &Path, work: &Path) -> Result<(), ImageError> {
    let deb = match &opts.kernel_deb {
        Some(deb) => deb.clone(),
        None => download_kernel(work)?,
    };
    let unpacked = work.join("kernel");
    run(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked),
        "unpack the kernel package",
    )?;
    let (kernel_version, bzimage) = find_bzimage(&unpacked.join("boot"))?;
    let bz = std::fs::read(&bzimage).map_err(io(format!("read {}", bzimage.display())))?;
    let vmlinux = kernel::extract_vmlinux(&bz)?;
    std::fs::write(dir.join("vmlinux"), vmlinux).map_err(io("write vmlinux"))?;
    let modules_root = unpacked.join("lib/modules").join(&kernel_version);
    let modules = kernel::resolve_modules(&modules_root, GUEST_MODULES)?;
    let extra = |wanted: &[&str]| -> Result<Vec<(String, PathBuf)>, ImageError> {
        Ok(kernel::resolve_modules(&modules_root, wanted)?
            .into_iter()
            .filter(|(name, _)| !modules.iter().any(|(m, _)| m == name))
            .collect())
    };
    let egress_modules = extra(EGRESS_MODULES)?;
    let volume_modules = extra(VOLUME_MODULES)?;
    for (name, file) in modules.iter().chain(&egress_modules).chain(&volume_modules) {
        let to = dir.join("modules").join(format!("{name}.ko"));
        std::fs::copy(file, &to).map_err(io(format!("copy module {name}")))?;
    }
    build_rootfs(&opts.images_dir, &dir.join("rootfs.ext4"))?;
    let manifest = Manifest {
        version: IMAGE_VERSION,
        host_image: koder_image::HOST_IMAGE_VERSION.into(),
        kernel_version,
        modules: modules.into_iter().map(|(n, _)| n).collect(),
        egress_modules: egress_modules.into_iter().map(|(n, _)| n).collect(),
        volume_modules: volume_modules.into_iter().map(|(n, _)| n).collect(),
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| io("encode manifest")(e.into()))?;
    // Written last: its presence says the rest is complete.
    std::fs::write(dir.join(MANIFEST), json).map_err(io("write manifest"))
}

fn tempdir_in(parent: &Path) -> Result<PathBuf, ImageError> {
    let dir = parent.join(format!(".microvm-build-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
    Ok(dir)
}

/// Downloads the package Debian's cloud-kernel meta package currently depends on, refreshing
/// the package lists once if that fails (a fresh machine may have none, an old one stale ones).
fn download_kernel(work: &Path) -> Result<PathBuf, ImageError> {
    fetch_kernel(work).or_else(|_| {
        run(
            Command::new("apt-get").args(["update", "-qq"]),
            "apt-get update",
        )?;
        fetch_kernel(work)
    })
}

fn fetch_kernel(work: &Path) -> Result<PathBuf, ImageError> {
    let package = kernel_package()?;
    run(
        Command::new("apt-get")
            .args(["download", "-q", &package])
            .current_dir(work),
        "apt-get download",
    )?;
    std::fs::read_dir(work)
        .map_err(io("list downloads"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .ok_or_else(|| ImageError::Tool {
            what: "apt-get download".into(),
            detail: format!("no .deb for {package}"),
        })
}

fn kernel_package() -> Result<String, ImageError> {
    let deps = output(
        Command::new("apt-cache").args(["depends", KERNEL_META_PACKAGE]),
        "apt-cache depends",
    )?;
    deps.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .map(str::to_string)
        .ok_or_else(|| ImageError::Tool {
            what: "find the cloud kernel package".into(),
            detail: format!("{KERNEL_META_PACKAGE} names no linux-image dependency"),
        })
}

fn find_bzimage(boot: &Path) -> Result<(String, PathBuf), ImageError> {
    std::fs::read_dir(boot)
        .map_err(io(format!("list {}", boot.display())))?
        .flatten()
        .find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("vmlinuz-")
                .map(|v| (v.to_string(), e.path()))
        })
        .ok_or_else(|| ImageError::Tool {
            what: "find the kernel".into(),
            detail: format!("no vmlinuz-* in {}", boot.display()),
        })
}

/// Makes the root disk: the generated `host` layer with the host's /usr bound over its `usr`
/// (minus [`USR_EXCLUDED`], each hidden under an empty tmpfs), written by `mkfs.ext4 -d`. The
/// mounts live in a private mount namespace of the mkfs process alone, so the host never sees
/// them and nothing is copied twice.
fn build_rootfs(images_dir: &Path, out: &Path) -> Result<(), ImageError> {
    let host = koder_image::host_image(images_dir).map_err(|e| ImageError::Tool {
        what: "build the host image".into(),
        detail: e.to_string(),
    })?;
    let usr_bytes = tree_bytes(Path::new("/usr"), USR_EXCLUDED);
    // ext4 metadata, the generated layer and room for the journal-less image's slack.
    let size_kib = usr_bytes / 1024 * 5 / 4 + 512 * 1024;
    let tmp = out.with_extension("partial");
    let script = r#"set -eu
usr=$1; layer=$2; out=$3; size=$4; shift 4
mount --bind "$usr" "$layer/usr"
for x in "$@"; do
  if [ -d "$layer/usr/$x" ]; then mount -t tmpfs -o size=1m,mode=755 none "$layer/usr/$x"; fi
done
mkfs.ext4 -q -F -L koder-root -O ^has_journal -E root_owner=0:0 -d "$layer" "$out" "${size}k"
"#;
    let status = run(
        Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                script,
                "sh",
                "/usr",
            ])
            .arg(&host.layer)
            .arg(&tmp)
            .arg(size_kib.to_string())
            .args(USR_EXCLUDED),
        "make the root disk",
    );
    if let Err(e) = status {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o444))
        .map_err(io("protect the root disk"))?;
    std::fs::rename(&tmp, out).map_err(io("install the root disk"))
}

/// Bytes of regular files below `root`, skipping `excluded` (relative) subtrees and other
/// filesystems' mounts.
fn tree_bytes(root: &Path, excluded: &[&str]) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(root).map(|m| m.dev()).unwrap_or(0);
    let skip: Vec<PathBuf> = excluded.iter().map(|e| root.join(e)).collect();
    let mut total = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                if meta.dev() == dev && !skip.contains(&path) {
                    stack.push(path);
                }
            } else if meta.is_file() {
                total += meta.len();
            }
        }
    }
    total
}

fn run(cmd: &mut Command, what: &str) -> Result<(), ImageError> {
    output(cmd, what).map(drop)
}

fn output(cmd: &mut Command, what: &str) -> Result<String, ImageError> {
    let out = cmd.output().map_err(|e| ImageError::Tool {
        what: what.into(),
        detail: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(ImageError::Tool {
            what: what.into(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_or_stale_images_are_not_built() {
        const HOST: &str = koder_image::HOST_IMAGE_VERSION;
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(load(dir.path()), Err(ImageError::NotBuilt(_))));
        let img = image_dir(dir.path());
        std::fs::create_dir_all(img.join("modules")).unwrap();
        let manifest = |version, host: &str| {
            serde_json::to_vec(&Manifest {
                version,
                host_image: host.into(),
                kernel_version: "6.1.0-test".into(),
                modules: vec!["virtio".into()],
                egress_modules: vec![],
                volume_modules: vec![],
            })
            .unwrap()
        };
        std::fs::write(img.join(MANIFEST), manifest(IMAGE_VERSION + 1, HOST)).unwrap();
        std::fs::write(img.join("vmlinux"), b"x").unwrap();
        std::fs::write(img.join("rootfs.ext4"), b"x").unwrap();
        std::fs::write(img.join("modules/virtio.ko"), b"x").unwrap();
        assert!(matches!(load(dir.path()), Err(ImageError::NotBuilt(_))));
        // Made from an older `host` image, or before its version was recorded.
        for old in [b"{\"version\":4}".to_vec(), manifest(IMAGE_VERSION, "0")] {
            std::fs::write(img.join(MANIFEST), old).unwrap();
            assert!(matches!(load(dir.path()), Err(ImageError::NotBuilt(_))));
        }
        std::fs::write(img.join(MANIFEST), manifest(IMAGE_VERSION, HOST)).unwrap();
        let image = load(dir.path()).unwrap();
        assert_eq!(image.kernel_version, "6.1.0-test");
        assert_eq!(image.modules[0].1, img.join("modules/virtio.ko"));
        std::fs::remove_file(img.join("modules/virtio.ko")).unwrap();
        assert!(matches!(load(dir.path()), Err(ImageError::NotBuilt(_))));
    }

    #[test]
    fn tree_size_skips_excluded_subtrees() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/big")).unwrap();
        std::fs::write(dir.path().join("a/small"), vec![0u8; 10]).unwrap();
        std::fs::write(dir.path().join("a/big/file"), vec![0u8; 1000]).unwrap();
        assert_eq!(tree_bytes(dir.path(), &[]), 1010);
        assert_eq!(tree_bytes(dir.path(), &["a/big"]), 10);
    }
}
