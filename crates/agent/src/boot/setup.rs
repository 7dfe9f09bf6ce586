//! Builds the sandbox root inside the fresh namespaces and pivots into it.
//!
//! Runs once, single-threaded, as PID 1 of new user/mount/pid/net/ipc/uts namespaces, before any
//! untrusted code exists. Every mount lives only in this mount namespace, so it disappears with
//! the sandbox's last process: the host never sees a sandbox mount and teardown cannot leak one.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use koder_agent_protocol::init::InitConfig;

use crate::setup_error::{SetupError, Step};

/// Devices bound from the host; the sandbox can use but never create device nodes.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// /proc entries that leak host kernel state or allow host-wide effects.
const PROC_MASKED: &[&str] = &["kcore", "keys", "timer_list", "sched_debug", "kallsyms"];
const PROC_READ_ONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs"];

/// Returns the overlay's upper directory, opened before the overlay hides it: the only way
/// back to it once the root is pivoted (snapshots read it through this descriptor).
pub fn build_root(cfg: &InitConfig) -> Result<OwnedFd, SetupError> {
    mount(None, "/", None, libc::MS_REC | libc::MS_PRIVATE, None).step("make mounts private")?;

    let upper = open_dir(Path::new(&cfg.upper_dir)).step("open upper layer")?;
    // Cloned while their host paths resolve; attached once the root is complete.
    let volumes = super::volumes::open_all(&cfg.volume_mounts)?;
    let layers = cfg
        .layer_mounts
        .iter()
        .map(|source| super::volumes::clone_mount(source).step("clone session layer"))
        .collect::<Result<Vec<_>, _>>()?;
    let root = mount_overlay(cfg, layers)?;
    for bind in &cfg.ro_binds {
        bind_read_only(Path::new(&bind.source), &inside(&root, &bind.target))?;
    }
    mount_proc(&root)?;
    mount_dev(&root)?;
    mount_tmp(&root, cfg.tmp_size_mib)?;
    own_boot_id(&root).step("give the sandbox its boot id")?;
    std::fs::create_dir_all(inside(&root, &cfg.workdir)).step("create workdir")?;
    pivot_into(&root)?;
    // Last, so no other mount covers a volume or is made inside one.
    super::volumes::mount_all(volumes)?;
    // We started in our cgroup, so a new cgroup namespace makes it the sandbox's cgroup root
    // and hides the host's hierarchy.
    unshare(libc::CLONE_NEWCGROUP).step("unshare cgroup namespace")?;
    rustix::system::sethostname(cfg.hostname.as_bytes())
        .map_err(std::io::Error::from)
        .step("set hostname")?;
    if !cfg.network_ready {
        loopback_up().step("bring loopback up")?;
        if cfg.egress {
            super::egress_rules::prepare()?;
        }
    }
    std::env::set_current_dir(&cfg.workdir).step("enter workdir")?;
    Ok(upper)
}

/// A directory descriptor that never follows a final symlink and never survives an exec.
pub fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::open(path, flags, Mode::empty())?)
}

/// Mounts the root overlay and returns where. overlayfs shows its layer options in mountinfo as
/// they were given, and sandbox processes read that, so no host path may be among them: the
/// overlay is mounted from a staging tmpfs on `root_target` whose symlinks stand for the host's
/// layers, with relative names, and on whose directories `s0…` the session's shared layers
/// (`layers`, detached mounts, top first) are attached, above the image's. The staging tmpfs
/// and those mounts exist only in this mount namespace and go with the old root after the
/// pivot (the overlay keeps its own references to its layers).
fn mount_overlay(cfg: &InitConfig, layers: Vec<OwnedFd>) -> Result<PathBuf, SetupError> {
    let staging = PathBuf::from(&cfg.root_target);
    mount(
        Some("tmpfs"),
        &staging,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some("mode=700,size=64k"),
    )
    .step("mount overlay staging")?;
    let mut lower = Vec::with_capacity(layers.len() + cfg.image_layers.len());
    for (i, tree) in layers.iter().enumerate() {
        let name = format!("s{i}");
        let at = staging.join(&name);
        std::fs::create_dir(&at).step("stage session layer")?;
        rustix::mount::move_mount(
            std::os::fd::AsFd::as_fd(tree),
            "",
            rustix::fs::CWD,
            &at,
            rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .map_err(std::io::Error::from)
        .step("stage session layer")?;
        lower.push(name);
    }
    for (i, layer) in cfg.image_layers.iter().enumerate() {
        let name = format!("l{i}");
        symlink(layer, staging.join(&name)).step("stage image layer")?;
        lower.push(name);
    }
    symlink(&cfg.upper_dir, staging.join("u")).step("stage upper layer")?;
    symlink(&cfg.work_dir, staging.join("w")).step("stage work dir")?;
    std::fs::create_dir(staging.join("r")).step("create root mount point")?;
    std::env::set_current_dir(&staging).step("enter overlay staging")?;
    // `userxattr`: an overlay mounted inside a user namespace may not use trusted.* xattrs.
    let opts = format!(
        "lowerdir={},upperdir=u,workdir=w,userxattr",
        lower.join(":")
    );
    mount(
        Some("overlay"),
        "r",
        Some("overlay"),
        libc::MS_NOSUID,
        Some(&opts),
    )
    .step("mount root overlay")?;
    Ok(staging.join("r"))
}

fn bind_read_only(source: &Path, target: &Path) -> Result<(), SetupError> {
    let what = format!("bind {}", target.display());
    std::fs::create_dir_all(target).step(&what)?;
    mount(
        Some(&source.to_string_lossy()),
        target,
        None,
        libc::MS_BIND | libc::MS_REC,
        None,
    )
    .step(&what)?;
    remount_read_only(target).step(what)
}

/// Remounting a bind mount inside a user namespace must keep the flags the host mount is locked
/// with (atime, noexec, ...), so they are read back and only restrictions are added.
fn remount_read_only(target: &Path) -> std::io::Result<()> {
    let st = rustix::fs::statvfs(target)?;
    let f = st.f_flag;
    use rustix::fs::StatVfsMountFlags as S;
    let mut flags =
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    for (have, add) in [
        (S::NOEXEC, libc::MS_NOEXEC),
        (S::NOATIME, libc::MS_NOATIME),
        (S::NODIRATIME, libc::MS_NODIRATIME),
        (S::RELATIME, libc::MS_RELATIME),
    ] {
        if f.contains(have) {
            flags |= add;
        }
    }
    mount(None, target, None, flags, None)
}

pub(crate) fn mount_tmp(root: &Path, size_mib: u64) -> Result<(), SetupError> {
    let opts = format!("mode=1777,size={}m", size_mib.max(1));
    mount(
        Some("tmpfs"),
        inside(root, "/tmp"),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&opts),
    )
    .step("mount /tmp")
}

pub(crate) fn mount_proc(root: &Path) -> Result<(), SetupError> {
    let proc_dir = inside(root, "/proc");
    std::fs::create_dir_all(&proc_dir).step("create /proc")?;
    mount(
        Some("proc"),
        &proc_dir,
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .step("mount /proc")?;
    for name in PROC_MASKED {
        let p = proc_dir.join(name);
        if p.exists() {
            mount(Some("/dev/null"), &p, None, libc::MS_BIND, None)
                .step(format!("mask /proc/{name}"))?;
        }
    }
    for name in PROC_READ_ONLY {
        let p = proc_dir.join(name);
        if p.exists() {
            mount(
                Some(&p.to_string_lossy()),
                &p,
                None,
                libc::MS_BIND | libc::MS_REC,
                None,
            )
            .and_then(|()| remount_read_only(&p))
            .step(format!("read-only /proc/{name}"))?;
        }
    }
    Ok(())
}

/// A boot id of the sandbox's own over the host kernel's: every start of a jail is a boot for
/// the code inside (a session paused to disk resumes with a fresh one, as a guest kernel would),
/// and the host's id is nothing a sandbox needs to learn. The file is made on the sandbox's
/// fresh /tmp, bound read-only over the entry and unlinked again before anything runs.
fn own_boot_id(root: &Path) -> std::io::Result<()> {
    let target = inside(root, "/proc/sys/kernel/random/boot_id");
    if !target.exists() {
        return Ok(());
    }
    let id = std::fs::read("/proc/sys/kernel/random/uuid")?;
    let file = inside(root, "/tmp/.koder-boot-id");
    std::fs::write(&file, id)?;
    let bound = mount(
        Some(&file.to_string_lossy()),
        &target,
        None,
        libc::MS_BIND,
        None,
    )
    .and_then(|()| remount_read_only(&target));
    std::fs::remove_file(&file)?;
    bound
}

pub(crate) fn mount_dev(root: &Path) -> Result<(), SetupError> {
    let dev = inside(root, "/dev");
    std::fs::create_dir_all(&dev).step("create /dev")?;
    mount(
        Some("tmpfs"),
        &dev,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=755,size=64k"),
    )
    .step("mount /dev")?;
    for name in DEVICES {
        let node = dev.join(name);
        std::fs::File::create(&node).step(format!("create /dev/{name}"))?;
        mount(
            Some(&format!("/dev/{name}")),
            &node,
            None,
            libc::MS_BIND,
            None,
        )
        .step(format!("bind /dev/{name}"))?;
    }
    let pts = dev.join("pts");
    std::fs::create_dir(&pts).step("create /dev/pts")?;
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .step("mount /dev/pts")?;
    let shm = dev.join("shm");
    std::fs::create_dir(&shm).step("create /dev/shm")?;
    mount(
        Some("tmpfs"),
        &shm,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777,size=64m"),
    )
    .step("mount /dev/shm")?;
    for (link, to) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(to, dev.join(link)).step(format!("link /dev/{link}"))?;
    }
    // Nothing may add device nodes or files to /dev later.
    mount(
        None,
        &dev,
        None,
        libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=755,size=64k"),
    )
    .step("seal /dev")
}

fn pivot_into(root: &Path) -> Result<(), SetupError> {
    std::env::set_current_dir(root).step("enter new root")?;
    // pivot_root(".", ".") stacks the old root under the new one; detaching it leaves no path
    // back to the host filesystem and needs no put_old directory in the image.
    rustix::process::pivot_root(".", ".")
        .map_err(std::io::Error::from)
        .step("pivot_root")?;
    rustix::mount::unmount(".", rustix::mount::UnmountFlags::DETACH)
        .map_err(std::io::Error::from)
        .step("detach old root")?;
    std::env::set_current_dir("/").step("enter /")
}

pub(crate) fn loopback_up() -> std::io::Result<()> {
    // SAFETY: plain socket/ioctl calls on a zeroed ifreq we own; the fd is closed below.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let mut rc = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req);
        if rc == 0 {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            rc = libc::ioctl(fd, libc::SIOCSIFFLAGS, &req);
        }
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if rc < 0 {
            return Err(err);
        }
    }
    Ok(())
}

/// `path` (absolute, in-sandbox) under the host directory where the root is assembled.
fn inside(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

fn unshare(flags: libc::c_int) -> std::io::Result<()> {
    // SAFETY: unshare of namespaces only (no CLONE_FILES/CLONE_FS on a multi-threaded process):
    // the agent is single-threaded while it sets up.
    if unsafe { libc::unshare(flags) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Thin `mount(2)`: the classic API takes the MS_* flag set the kernel documents, which rustix
/// splits over several functions; one wrapper keeps each call site readable.
pub(crate) fn mount(
    source: Option<&str>,
    target: impl AsRef<Path>,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> std::io::Result<()> {
    let cstr =
        |s: &str| CString::new(s).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL));
    let target = cstr(&target.as_ref().to_string_lossy())?;
    let source = source.map(cstr).transpose()?;
    let fstype = fstype.map(cstr).transpose()?;
    let data = data.map(cstr).transpose()?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is a valid NUL-terminated string or null, alive for the call.
    let rc = unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
