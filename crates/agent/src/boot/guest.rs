//! The agent as `/init` of a microVM guest.
//!
//! The kernel starts the agent from the initramfs with nothing mounted. It loads the virtio
//! modules the image builder listed, reads its [`VmConfig`], mounts the read-only image disk
//! under an overlay whose writable layer is the session's scratch disk (for a sandbox made from
//! a snapshot, first filled with its captured layers), builds the same minimal
//! /proc, /dev and /tmp a jail gets, moves the root over the initramfs and confines itself like
//! a jail agent. Sandbox processes run in one cgroup-v2 group whose limits the daemon sets over
//! the protocol; the agent stays outside it, so an OOM kill never takes the agent.

use std::ffi::CString;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use koder_agent_protocol::init::{
    link_sudo_layer, VmConfig, VmLayers, VM_CONFIG_PATH, VM_EGRESS_MODULES_LIST, VM_MODULES_LIST,
    VM_VOLUME_MODULES_LIST,
};
use koder_agent_protocol::GuestLimits;
use koder_layer::{ApplyOptions, Limits, Owners};

use super::egress_rules;
use super::setup::{self, mount};
use crate::child;
use crate::guest_cgroup::SandboxCgroup;
use crate::setup_error::{SetupError, Step};

const NEW_ROOT: &str = "/newroot";
const IMAGE_MNT: &str = "/mnt/image";
const SCRATCH_MNT: &str = "/mnt/scratch";
const CGROUP_MNT: &str = "/mnt/cgroup";
/// The root overlay's bottom layer, in the initramfs: the agent (/init) as `sudo`, linked
/// there as a jail's runtime links it for its sandboxes (`init::link_sudo_layer`).
const SUDO_LAYER: &str = "/mnt/sudo";
const SANDBOX_CGROUP: &str = "sandbox";
/// Virtio devices appear while their driver's module loads, but their block nodes a moment
/// later; a boot that has not found its disks by then is broken.
const DISK_WAIT: Duration = Duration::from_secs(10);
/// Entries one restored sandbox may hold, as in a jail (a million empty files is a hostile
/// layer, not a workspace).
const MAX_LAYER_ENTRIES: u64 = 500_000;

/// True when this process is the kernel's init inside a koder guest.
pub fn is_guest_init() -> bool {
    std::process::id() == 1 && Path::new(VM_CONFIG_PATH).exists()
}

/// What a booted guest serves from.
pub struct Booted {
    pub cfg: VmConfig,
    pub cgroup: SandboxCgroup,
    /// The overlay's upper directory (see [`setup::build_root`]).
    pub upper: OwnedFd,
    /// The agent's virtio-serial port, when the configuration names one (else vsock).
    pub serial: Option<OwnedFd>,
}

/// Boots the guest up to the point where the agent can serve.
pub fn boot() -> Result<Booted, SetupError> {
    mount_kernel_filesystems()?;
    load_modules(VM_MODULES_LIST)?;
    let cfg = read_config()?;
    // Opened from the kernel's /dev: the sandbox's sealed /dev never has the node.
    let serial = cfg
        .serial_port
        .as_deref()
        .map(crate::serial::open)
        .transpose()
        .step("open the agent's serial port")?;
    if cfg.egress {
        load_modules(VM_EGRESS_MODULES_LIST)?;
    }
    if !cfg.volumes.is_empty() {
        load_modules(VM_VOLUME_MODULES_LIST)?;
    }
    let root_disk = wait_for_disk(&cfg.root_disk_serial)?;
    let scratch_disk = wait_for_disk(&cfg.scratch_disk_serial)?;
    let upper = mount_root(&root_disk, &scratch_disk, cfg.layers.as_ref())?;
    let cgroup = create_sandbox_cgroup(&cfg.limits)?;
    let root = Path::new(NEW_ROOT);
    setup::mount_proc(root)?;
    setup::mount_dev(root)?;
    setup::mount_tmp(root, cfg.tmp_size_mib)?;
    std::fs::create_dir_all(root.join(cfg.workdir.trim_start_matches('/')))
        .step("create workdir")?;
    // Attached after every other mount and the root switch, so each target resolves inside
    // the sandbox's root, as in a jail.
    let volumes = super::volumes::open_shares(&cfg.volumes)?;
    switch_root()?;
    super::volumes::mount_all(volumes)?;
    rustix::system::sethostname(cfg.hostname.as_bytes())
        .map_err(std::io::Error::from)
        .step("set hostname")?;
    setup::loopback_up().step("bring loopback up")?;
    if cfg.egress {
        egress_rules::prepare()?;
    }
    std::env::set_current_dir(&cfg.workdir).step("enter workdir")?;
    Ok(Booted {
        cfg,
        cgroup,
        upper,
        serial,
    })
}

fn mount_kernel_filesystems() -> Result<(), SetupError> {
    for (fstype, dir) in [("devtmpfs", "/dev"), ("proc", "/proc"), ("sysfs", "/sys")] {
        std::fs::create_dir_all(dir).step(format!("create {dir}"))?;
        mount(
            Some(fstype),
            dir,
            Some(fstype),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            None,
        )
        .step(format!("mount {dir}"))?;
    }
    Ok(())
}

/// Loads the modules `list` names, in order; the files sit next to it.
fn load_modules(list: &str) -> Result<(), SetupError> {
    let dir = Path::new(list).parent().unwrap_or(Path::new("/"));
    let list = std::fs::read_to_string(list).step(format!("read module list {list}"))?;
    for name in list.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let file = std::fs::File::open(dir.join(name)).step(format!("open module {name}"))?;
        let params = CString::default();
        // SAFETY: finit_module reads the open module file and a NUL-terminated empty string.
        let rc =
            unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), params.as_ptr(), 0) };
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EEXIST) {
                return Err(err).step(format!("load module {name}"));
            }
        }
    }
    Ok(())
}

fn read_config() -> Result<VmConfig, SetupError> {
    let mut raw = String::new();
    std::fs::File::open(VM_CONFIG_PATH)
        .and_then(|mut f| f.read_to_string(&mut raw))
        .step("read guest config")?;
    serde_json::from_str(&raw)
        .map_err(std::io::Error::other)
        .step("parse guest config")
}

/// The `/dev` node of the virtio disk whose serial is `serial`.
fn wait_for_disk(serial: &str) -> Result<PathBuf, SetupError> {
    let deadline = Instant::now() + DISK_WAIT;
    loop {
        if let Some(name) = find_disk(serial) {
            let node = Path::new("/dev").join(&name);
            if node.exists() {
                return Ok(node);
            }
        }
        if Instant::now() > deadline {
            return Err(std::io::Error::from(std::io::ErrorKind::NotFound))
                .step(format!("find disk {serial}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn find_disk(serial: &str) -> Option<String> {
    std::fs::read_dir("/sys/block")
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|name| {
            std::fs::read_to_string(Path::new("/sys/block").join(name).join("serial"))
                .is_ok_and(|s| s.trim() == serial)
        })
}

fn mount_root(
    root_disk: &Path,
    scratch_disk: &Path,
    layers: Option<&VmLayers>,
) -> Result<OwnedFd, SetupError> {
    for dir in [IMAGE_MNT, SCRATCH_MNT, NEW_ROOT] {
        std::fs::create_dir_all(dir).step(format!("create {dir}"))?;
    }
    mount(
        Some(&root_disk.to_string_lossy()),
        IMAGE_MNT,
        Some("ext4"),
        libc::MS_RDONLY | libc::MS_NODEV,
        Some("noload"),
    )
    .step("mount image disk")?;
    // noinit_itable: the fresh filesystem's inode tables are flagged uninitialised already;
    // zeroing them in the background would only cost an idle guest CPU and the host disk.
    mount(
        Some(&scratch_disk.to_string_lossy()),
        SCRATCH_MNT,
        Some("ext4"),
        libc::MS_NODEV,
        Some("noinit_itable"),
    )
    .step("mount scratch disk")?;
    let upper = Path::new(SCRATCH_MNT).join("upper");
    let work = Path::new(SCRATCH_MNT).join("work");
    for dir in [&upper, &work] {
        std::fs::create_dir_all(dir).step("create overlay layers")?;
    }
    let upper_fd = setup::open_dir(&upper).step("open upper layer")?;
    if let Some(layers) = layers {
        restore_layers(upper_fd.as_fd(), layers)?;
    }
    // `userxattr`, as in a jail: overlayfs then marks opaque directories `user.overlay.opaque`,
    // the attribute layers carry; with `trusted.*` a capture would lose them and a restore
    // would write one this overlay ignores.
    // The initramfs is one filesystem: /init links into the layer beside it.
    let agent = std::fs::read_link("/proc/self/exe").step("find the agent binary")?;
    link_sudo_layer(&agent, Path::new(SUDO_LAYER)).step("stage sudo layer")?;
    let opts = format!(
        "lowerdir={IMAGE_MNT}:{SUDO_LAYER},upperdir={},workdir={},userxattr",
        upper.display(),
        work.display()
    );
    mount(
        Some("overlay"),
        NEW_ROOT,
        Some("overlay"),
        libc::MS_NODEV,
        Some(&opts),
    )
    .step("mount root overlay")?;
    Ok(upper_fd)
}

/// Applies the captured layers, bottom first, onto the still empty upper directory. The
/// archives were made by sandboxes and are hostile; `koder-layer` never writes outside
/// `upper`. Their ids are guest ids, which is what this guest's files carry: they land as
/// they are.
fn restore_layers(upper: BorrowedFd<'_>, layers: &VmLayers) -> Result<(), SetupError> {
    let disk = wait_for_disk(&layers.disk_serial)?;
    let disk = File::open(disk).step("open layers disk")?;
    let opts = ApplyOptions {
        limits: Limits {
            max_bytes: layers.max_bytes,
            max_entries: MAX_LAYER_ENTRIES,
        },
        owners: Owners::AsIs,
    };
    let mut offset = 0u64;
    for (n, size) in layers.sizes.iter().enumerate() {
        let step = || format!("restore layer {} of {}", n + 1, layers.sizes.len());
        (&disk).seek(SeekFrom::Start(offset)).step(step())?;
        let input = BufReader::with_capacity(256 * 1024, (&disk).take(*size));
        koder_layer::apply(upper, input, &opts)
            .map_err(std::io::Error::other)
            .step(step())?;
        offset = offset.saturating_add(*size);
    }
    Ok(())
}

/// The initramfs is the kernel's rootfs, which cannot be pivoted away: the new root is moved
/// over it and entered with chroot, the way switch_root does it.
fn switch_root() -> Result<(), SetupError> {
    std::env::set_current_dir(NEW_ROOT).step("enter new root")?;
    mount(Some("."), "/", None, libc::MS_MOVE, None).step("move new root")?;
    rustix::process::chroot(".")
        .map_err(std::io::Error::from)
        .step("chroot")?;
    std::env::set_current_dir("/").step("enter /")
}

/// Creates the cgroup-v2 group every sandbox process runs in, opens the files the agent drives
/// it through, makes every later child join it and applies the boot-time limits.
fn create_sandbox_cgroup(limits: &GuestLimits) -> Result<SandboxCgroup, SetupError> {
    std::fs::create_dir_all(CGROUP_MNT).step("create cgroup mount point")?;
    mount(
        Some("cgroup2"),
        CGROUP_MNT,
        Some("cgroup2"),
        libc::MS_NOSUID | libc::MS_NOEXEC | libc::MS_NODEV,
        None,
    )
    .step("mount cgroup2")?;
    let top = Path::new(CGROUP_MNT);
    std::fs::write(top.join("cgroup.subtree_control"), "+memory +pids +cpu")
        .step("enable cgroup controllers")?;
    let dir = top.join(SANDBOX_CGROUP);
    std::fs::create_dir_all(&dir).step("create sandbox cgroup")?;
    let (cg, procs) = SandboxCgroup::open(&dir)?;
    child::set_workload_cgroup(vec![procs])
        .map_err(std::io::Error::other)
        .step("keep the sandbox cgroup")?;
    cg.set_limits(limits)
        .map_err(|e| std::io::Error::other(e.message))
        .step("apply guest limits")?;
    Ok(cg)
}
