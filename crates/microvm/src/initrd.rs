//! The guest's initramfs: the agent as `/init`, the shared libraries it links, the boot modules
//! and, appended per VM, its configuration. Linux unpacks concatenated newc archives in order,
//! so a VM's initrd is the shared base followed by one tiny archive of its own.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::image::VmImage;
use cpio::NewcBuilder;
use koder_agent_protocol::init::{
    VmConfig, VM_CONFIG_PATH, VM_EGRESS_MODULES_LIST, VM_MODULES_LIST, VM_VOLUME_MODULES_LIST,
};

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFCHR: u32 = 0o020000;

#[derive(Debug, thiserror::Error)]
pub enum InitrdError {
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("cannot list the agent's libraries: {0}")]
    Libraries(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> InitrdError {
    let what = what.into();
    move |e| InitrdError::Io(what, e)
}

/// An archive being written: entries get distinct inode numbers, directories are emitted once.
struct Archive<W: Write> {
    out: Option<W>,
    next_ino: u32,
    dirs: std::collections::BTreeSet<String>,
}

impl<W: Write> Archive<W> {
    fn new(out: W) -> Self {
        Self {
            out: Some(out),
            next_ino: 1,
            dirs: Default::default(),
        }
    }

    fn entry(
        &mut self,
        name: &str,
        mode: u32,
        data: &[u8],
        rdev: (u32, u32),
    ) -> std::io::Result<()> {
        let out = self
            .out
            .take()
            .ok_or_else(|| std::io::Error::other("archive finished"))?;
        let size =
            u32::try_from(data.len()).map_err(|_| std::io::Error::other("file too large"))?;
        let mut w = NewcBuilder::new(name)
            .ino(self.next_ino)
            .mode(mode)
            .nlink(if mode & S_IFDIR != 0 { 2 } else { 1 })
            .rdev_major(rdev.0)
            .rdev_minor(rdev.1)
            .write(out, size);
        self.next_ino += 1;
        w.write_all(data)?;
        self.out = Some(w.finish()?);
        Ok(())
    }

    /// Creates `path`'s parent directories (not `path` itself) that this archive lacks.
    fn parents(&mut self, path: &str) -> std::io::Result<()> {
        let mut prefix = String::new();
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if self.dirs.insert(prefix.clone()) {
                let name = prefix.clone();
                self.entry(&name, S_IFDIR | 0o755, &[], (0, 0))?;
            }
        }
        Ok(())
    }

    fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> std::io::Result<()> {
        let path = path.trim_start_matches('/');
        self.parents(path)?;
        self.entry(path, S_IFREG | mode, data, (0, 0))
    }

    fn finish(mut self) -> std::io::Result<W> {
        let out = self
            .out
            .take()
            .ok_or_else(|| std::io::Error::other("archive finished"))?;
        cpio::newc::trailer(out)
    }
}

/// Writes the shared base archive: `/init` (the agent), its libraries, the console node, the
/// boot modules and the image's optional module sets (egress, volumes), each set with its
/// load order.
pub fn write_base(out_path: &Path, agent: &Path, image: &VmImage) -> Result<(), InitrdError> {
    let tmp = out_path.with_extension("partial");
    let file = std::fs::File::create(&tmp).map_err(io(format!("create {}", tmp.display())))?;
    let mut a = Archive::new(std::io::BufWriter::new(file));
    let agent_bytes = std::fs::read(agent).map_err(io(format!("read {}", agent.display())))?;
    let result = (|| -> Result<(), InitrdError> {
        let w = |e| InitrdError::Io(format!("write {}", tmp.display()), e);
        a.file("init", 0o755, &agent_bytes).map_err(w)?;
        for lib in linked_libraries(agent)? {
            let bytes = std::fs::read(&lib).map_err(io(format!("read {}", lib.display())))?;
            a.file(&lib.to_string_lossy(), 0o755, &bytes).map_err(w)?;
        }
        // The kernel opens /dev/console for init's stdio before running it.
        a.parents("dev/console").map_err(w)?;
        a.entry("dev/console", S_IFCHR | 0o600, &[], (5, 1))
            .map_err(w)?;
        add_modules(&mut a, VM_MODULES_LIST, &image.modules)?;
        add_modules(&mut a, VM_EGRESS_MODULES_LIST, &image.egress_modules)?;
        add_modules(&mut a, VM_VOLUME_MODULES_LIST, &image.volume_modules)?;
        let mut out = a.finish().map_err(w)?;
        out.flush().map_err(w)?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, out_path).map_err(io(format!("install {}", out_path.display())))
}

/// Adds `modules` next to `list`, and `list` naming them in load order.
fn add_modules<W: Write>(
    a: &mut Archive<W>,
    list: &str,
    modules: &[(String, PathBuf)],
) -> Result<(), InitrdError> {
    let w = |e| InitrdError::Io(format!("write module list {list}"), e);
    let dir = Path::new(list)
        .parent()
        .unwrap_or(Path::new("/"))
        .to_string_lossy()
        .into_owned();
    let mut order = String::new();
    for (name, file) in modules {
        let bytes = std::fs::read(file).map_err(io(format!("read {}", file.display())))?;
        let file_name = format!("{name}.ko");
        a.file(&format!("{dir}/{file_name}"), 0o644, &bytes)
            .map_err(w)?;
        order.push_str(&file_name);
        order.push('\n');
    }
    a.file(list, 0o644, order.as_bytes()).map_err(w)
}

/// A VM's own initrd: the base archive followed by one carrying its configuration.
pub fn write_for_vm(base: &Path, cfg: &VmConfig, out_path: &Path) -> Result<(), InitrdError> {
    std::fs::copy(base, out_path).map_err(io(format!("copy {}", base.display())))?;
    let json =
        serde_json::to_vec(cfg).map_err(|e| InitrdError::Io("encode config".into(), e.into()))?;
    let file = std::fs::OpenOptions::new()
        .append(true)
        .open(out_path)
        .map_err(io(format!("open {}", out_path.display())))?;
    let mut a = Archive::new(std::io::BufWriter::new(file));
    // The base archive made the directories; only the file is new.
    a.dirs.insert("koder".into());
    let w = |e| InitrdError::Io(format!("write {}", out_path.display()), e);
    a.file(VM_CONFIG_PATH, 0o600, &json).map_err(w)?;
    a.finish().map_err(w)?.flush().map_err(w)
}

/// The shared objects `binary` needs at run time, the dynamic loader included, as absolute
/// paths. `ldd` is the authority on the loader's search rules; reimplementing them would be
/// guesswork.
fn linked_libraries(binary: &Path) -> Result<Vec<PathBuf>, InitrdError> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| InitrdError::Libraries(format!("run ldd: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("not a dynamic executable")
        || String::from_utf8_lossy(&out.stderr).contains("not a dynamic executable")
    {
        return Ok(Vec::new());
    }
    if !out.status.success() {
        return Err(InitrdError::Libraries(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    parse_ldd(&text)
}

fn parse_ldd(text: &str) -> Result<Vec<PathBuf>, InitrdError> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.contains("=> not found") {
            return Err(InitrdError::Libraries(format!("missing library: {line}")));
        }
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.trim(),
            None => line,
        };
        let path = path.split(" (").next().unwrap_or("").trim();
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x1)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x2)\n\t/lib64/ld-linux-x86-64.so.2 (0x3)\n";
        let libs = parse_ldd(text).unwrap();
        assert_eq!(
            libs,
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse_ldd("\tlibfoo.so => not found\n").is_err());
    }

    /// Reads an archive back with the cpio crate's reader: names, modes and contents.
    fn entries(bytes: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut rest = bytes;
        loop {
            let r = cpio::NewcReader::new(rest).unwrap();
            if r.entry().is_trailer() {
                // Archives are padded to 4 bytes; a following archive starts after the padding.
                let mut tail = r.finish().unwrap();
                while tail.first() == Some(&0) {
                    tail = &tail[1..];
                }
                if tail.is_empty() {
                    return out;
                }
                rest = tail;
                continue;
            }
            let name = r.entry().name().to_string();
            let mode = r.entry().mode();
            let mut data = Vec::new();
            let mut r = r;
            std::io::Read::read_to_end(&mut r, &mut data).unwrap();
            out.push((name, mode, data));
            rest = r.finish().unwrap();
        }
    }

    #[test]
    fn base_and_vm_archives() {
        let dir = tempfile::tempdir().unwrap();
        let module = dir.path().join("virtio.ko");
        std::fs::write(&module, b"module bytes").unwrap();
        let nft = dir.path().join("nf_tables.ko");
        std::fs::write(&nft, b"nft bytes").unwrap();
        let agent = std::env::current_exe().unwrap();
        let base = dir.path().join("base.cpio");
        let fuse = dir.path().join("fuse.ko");
        std::fs::write(&fuse, b"fuse bytes").unwrap();
        let image = VmImage {
            dir: dir.path().into(),
            kernel_version: "6.1.0-test".into(),
            vmlinux: dir.path().join("vmlinux"),
            rootfs: dir.path().join("rootfs.ext4"),
            modules: vec![("virtio".into(), module)],
            egress_modules: vec![("nf_tables".into(), nft)],
            volume_modules: vec![("fuse".into(), fuse)],
        };
        write_base(&base, &agent, &image).unwrap();
        let cfg = VmConfig {
            hostname: "sandbox".into(),
            workdir: "/workspace".into(),
            env: vec![("A".into(), "b".into())],
            writable_dirs: vec!["/tmp".into()],
            rlimits: koder_agent_protocol::init::Rlimits {
                nofile: 1,
                nproc: 2,
                core: 0,
            },
            tmp_size_mib: 8,
            vsock_port: 1024,
            serial_port: Some("koder.agent".into()),
            limits: Default::default(),
            root_disk_serial: "koder-root".into(),
            scratch_disk_serial: "koder-scratch".into(),
            egress: true,
            layers: Some(koder_agent_protocol::init::VmLayers {
                disk_serial: "koder-layers".into(),
                sizes: vec![10240, 2048],
                max_bytes: 64 << 20,
            }),
            volumes: vec![koder_agent_protocol::init::VmVolume {
                tag: "koder-volume-0".into(),
                target: "/data".into(),
                read_only: true,
            }],
        };
        let vm = dir.path().join("vm.cpio");
        write_for_vm(&base, &cfg, &vm).unwrap();
        let all = entries(&std::fs::read(&vm).unwrap());
        let find = |n: &str| {
            all.iter()
                .find(|(name, ..)| name == n)
                .unwrap_or_else(|| panic!("{n} missing"))
        };
        assert_eq!(find("init").2, std::fs::read(&agent).unwrap());
        assert_eq!(find("init").1, S_IFREG | 0o755);
        assert_eq!(find("dev/console").1, S_IFCHR | 0o600);
        assert_eq!(find("koder/modules/virtio.ko").2, b"module bytes");
        assert_eq!(find("koder/modules/order").2, b"virtio.ko\n");
        assert_eq!(find("koder/modules/egress").2, b"nf_tables.ko\n");
        assert_eq!(find("koder/modules/nf_tables.ko").2, b"nft bytes");
        assert_eq!(find("koder/modules/volumes").2, b"fuse.ko\n");
        let parsed: VmConfig = serde_json::from_slice(&find("koder/config.json").2).unwrap();
        assert_eq!(parsed, cfg);
        assert!(
            all.iter().any(|(n, ..)| n.ends_with("libc.so.6")),
            "libc not packed"
        );
        assert!(
            all.iter().filter(|(n, ..)| n == "koder").count() == 1,
            "directory twice"
        );
    }
}
