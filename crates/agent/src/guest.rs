//! The agent as `/init` of a microVM guest.
//!
//! The kernel starts the agent from the initramfs with nothing mounted. It loads the virtio
//! modules the image builder listed, reads its [`VmConfig`], mounts the read-only image disk
//! under an overlay whose writable layer is the session's scratch disk, builds the same minimal
//! /proc, /dev and /tmp a jail gets, moves the root over the initramfs and confines itself like
//! a jail agent. Sandbox processes run in one cgroup-v2 group whose limits the daemon sets over
//! the protocol; the agent stays outside it, so an OOM kill never takes the agent.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use koder_agent_protocol::init::{
    VmConfig, VM_CONFIG_PATH, VM_EGRESS_MODULES_LIST, VM_MODULES_LIST,
};
use koder_agent_protocol::{AgentError, ErrorCode, GuestLimits, GuestUsage};

use crate::setup::{self, mount, SetupError, Step};

const NEW_ROOT: &str = "/newroot";
const IMAGE_MNT: &str = "/mnt/image";
const SCRATCH_MNT: &str = "/mnt/scratch";
const CGROUP_MNT: &str = "/mnt/cgroup";
const SANDBOX_CGROUP: &str = "sandbox";
/// Virtio devices appear while their driver's module loads, but their block nodes a moment
/// later; a boot that has not found its disks by then is broken.
const DISK_WAIT: Duration = Duration::from_secs(10);

/// True when this process is the kernel's init inside a koder guest.
pub fn is_guest_init() -> bool {
    std::process::id() == 1 && Path::new(VM_CONFIG_PATH).exists()
}

/// Boots the guest up to the point where the agent can serve: returns its configuration and
/// the sandbox cgroup.
pub fn boot() -> Result<(VmConfig, SandboxCgroup), SetupError> {
    mount_kernel_filesystems()?;
    load_modules(VM_MODULES_LIST)?;
    let cfg = read_config()?;
    if cfg.egress {
        load_modules(VM_EGRESS_MODULES_LIST)?;
    }
    let root_disk = wait_for_disk(&cfg.root_disk_serial)?;
    let scratch_disk = wait_for_disk(&cfg.scratch_disk_serial)?;
    mount_root(&root_disk, &scratch_disk)?;
    let cgroup = SandboxCgroup::create(&cfg.limits)?;
    let root = Path::new(NEW_ROOT);
    setup::mount_proc(root)?;
    setup::mount_dev(root)?;
    setup::mount_tmp(root, cfg.tmp_size_mib)?;
    std::fs::create_dir_all(root.join(cfg.workdir.trim_start_matches('/')))
        .step("create workdir")?;
    switch_root()?;
    rustix::system::sethostname(cfg.hostname.as_bytes())
        .map_err(std::io::Error::from)
        .step("set hostname")?;
    setup::loopback_up().step("bring loopback up")?;
    if cfg.egress {
        crate::egress::prepare()?;
    }
    std::env::set_current_dir(&cfg.workdir).step("enter workdir")?;
    Ok((cfg, cgroup))
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

fn mount_root(root_disk: &Path, scratch_disk: &Path) -> Result<(), SetupError> {
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
    let opts = format!(
        "lowerdir={IMAGE_MNT},upperdir={},workdir={}",
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
    .step("mount root overlay")
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

/// The cgroup-v2 group every sandbox process runs in, driven through descriptors opened at boot:
/// once Landlock is in force the agent could not open the cgroup files again (and must not be
/// able to: its children inherit its domain).
pub struct SandboxCgroup {
    memory_max: OwnedFd,
    pids_max: OwnedFd,
    cpu_max: OwnedFd,
    memory_current: OwnedFd,
    memory_peak: OwnedFd,
    memory_events: OwnedFd,
    pids_current: OwnedFd,
    pids_events: OwnedFd,
    cpu_stat: OwnedFd,
    freeze: OwnedFd,
}

impl SandboxCgroup {
    fn create(limits: &GuestLimits) -> Result<Self, SetupError> {
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
        let open = |name: &str, write: bool| -> Result<OwnedFd, SetupError> {
            std::fs::OpenOptions::new()
                .read(!write)
                .write(write)
                .open(dir.join(name))
                .map(OwnedFd::from)
                .step(format!("open cgroup file {name}"))
        };
        let cg = SandboxCgroup {
            memory_max: open("memory.max", true)?,
            pids_max: open("pids.max", true)?,
            cpu_max: open("cpu.max", true)?,
            memory_current: open("memory.current", false)?,
            memory_peak: open("memory.peak", false)?,
            memory_events: open("memory.events", false)?,
            pids_current: open("pids.current", false)?,
            pids_events: open("pids.events", false)?,
            cpu_stat: open("cpu.stat", false)?,
            freeze: open("cgroup.freeze", true)?,
        };
        crate::child::set_workload_cgroup(vec![open("cgroup.procs", true)?])
            .map_err(std::io::Error::other)
            .step("keep the sandbox cgroup")?;
        cg.set_limits(limits)
            .map_err(|e| std::io::Error::other(e.message))
            .step("apply guest limits")?;
        Ok(cg)
    }

    pub fn set_limits(&self, limits: &GuestLimits) -> Result<(), AgentError> {
        if let Some(bytes) = limits.memory_bytes {
            write_at(&self.memory_max, &bytes.to_string())?;
        }
        if let Some(pids) = limits.pids {
            write_at(&self.pids_max, &pids.to_string())?;
        }
        if let Some(millis) = limits.cpu_millis {
            // 100 ms period; quota in µs per period.
            let quota = u64::from(millis.max(1)) * 100;
            write_at(&self.cpu_max, &format!("{quota} 100000"))?;
        }
        Ok(())
    }

    pub fn freeze(&self, frozen: bool) -> Result<(), AgentError> {
        write_at(&self.freeze, if frozen { "1" } else { "0" })
    }

    pub fn usage(&self) -> Result<GuestUsage, AgentError> {
        let number = |fd: &OwnedFd| -> Result<u64, AgentError> {
            read_at(fd)?
                .trim()
                .parse()
                .map_err(|_| AgentError::new(ErrorCode::Io, "unreadable cgroup counter"))
        };
        Ok(GuestUsage {
            memory_current_bytes: number(&self.memory_current)?,
            memory_peak_bytes: number(&self.memory_peak)?,
            oom_kills: keyed(&read_at(&self.memory_events)?, "oom_kill"),
            cpu_usage_us: keyed(&read_at(&self.cpu_stat)?, "usage_usec"),
            pids_current: number(&self.pids_current)?,
            pids_max_hits: keyed(&read_at(&self.pids_events)?, "max"),
        })
    }
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines); 0 when absent.
fn keyed(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

fn read_at(fd: &OwnedFd) -> Result<String, AgentError> {
    let mut buf = vec![0u8; 4096];
    let n = rustix::io::pread(fd, &mut buf, 0)
        .map_err(|e| AgentError::new(ErrorCode::Io, format!("read cgroup file: {e}")))?;
    buf.truncate(n);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn write_at(fd: &OwnedFd, value: &str) -> Result<(), AgentError> {
    rustix::io::pwrite(fd, value.as_bytes(), 0)
        .map(drop)
        .map_err(|e| AgentError::new(ErrorCode::Io, format!("write cgroup file: {e}")))
}

#[cfg(test)]
mod tests {
    use super::keyed;

    #[test]
    fn flat_keyed_files() {
        let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(keyed(events, "oom_kill"), 2);
        assert_eq!(keyed(events, "oom"), 3);
        assert_eq!(keyed(events, "max"), 12);
        assert_eq!(keyed(events, "missing"), 0);
        assert_eq!(keyed("usage_usec nonsense\n", "usage_usec"), 0);
    }
}
