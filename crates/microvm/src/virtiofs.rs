//! The host side of a QEMU guest's volumes: one `virtiofsd` per share, serving the volume's
//! directory over vhost-user to a `vhost-user-fs-device`. A file-level share, because the host
//! keeps the volume mounted for its own file API: two kernels writing one ext4 image corrupt
//! it.
//!
//! virtiofsd runs as root (it creates files with the guest caller's uid and gid, so files keep
//! the sandbox-relative owners jails give them) and is started in a mount namespace of its own
//! where the volume's root is a bind mount `nosuid,nodev,noexec` — and `ro` for a read-only
//! volume, so a hostile guest that ignores its own read-only mount still cannot write. Its
//! `sandbox=namespace` mode then pivots into that directory: nothing outside the volume exists
//! for it, `..` of its root is its root, and it resolves every name from an `O_PATH` descriptor
//! without following symlinks. Device nodes or setuid files a guest creates stay inert on the
//! host (`nodev`, `nosuid`, and the host's own volume mount is `nosuid,nodev,noexec`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use koder_runtime::RuntimeError;
use tokio::process::{Child, Command};

use crate::vmm::{Launch, Share};

/// virtiofsd creates its socket at start.
const SOCKET_WAIT: Duration = Duration::from_secs(10);

/// Where virtiofsd is installed: on PATH (the standalone Rust package) or QEMU's helper dir
/// (Debian 12 ships it with qemu-system-common).
pub fn find() -> Option<PathBuf> {
    crate::qemu::find_program(Path::new("virtiofsd")).or_else(|| {
        ["/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
    })
}

/// The tag the guest mounts share `n` by.
pub fn tag(n: usize) -> String {
    format!("koder-volume-{n}")
}

/// The vhost-user socket of share `n` in the VM's directory.
pub fn socket(dir: &Path, n: usize) -> PathBuf {
    dir.join(format!("fs{n}.sock"))
}

/// Starts the virtiofsd of share `n` and returns once its socket exists, open to the VMM's uid.
pub async fn spawn(
    virtiofsd: &Path,
    launch: &Launch,
    n: usize,
    share: &Share,
    log: Stdio,
) -> Result<Child, RuntimeError> {
    let source = share.source.to_str().filter(|s| !s.contains(','));
    let source = source.ok_or_else(|| {
        // virtiofsd splits its `-o` options at commas.
        RuntimeError::Start(format!(
            "volume path {} cannot be shared",
            share.source.display()
        ))
    })?;
    let sock = socket(&launch.dir, n);
    let _ = std::fs::remove_file(&sock);
    let mut cmd = Command::new(virtiofsd);
    cmd.arg(format!("--socket-path={}", sock.display()))
        .args(["-o", &format!("source={source}")])
        // cache=none: the host's file API writes the same files; the guest sees them at once.
        .args(["-o", "sandbox=namespace", "-o", "cache=none"])
        .args(["-o", "no_posix_lock", "-o", "no_flock", "-o", "no_xattr"])
        .args(["-o", "log_level=warn", "-f"])
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .process_group(0);
    crate::vmm::stdio_only(&mut cmd);
    private_view(&mut cmd, &share.source, share.read_only)?;
    let mut child = cmd
        .spawn()
        .map_err(|e| RuntimeError::Start(format!("start virtiofsd: {e}")))?;
    let deadline = Instant::now() + SOCKET_WAIT;
    while !sock.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(RuntimeError::Start(format!(
                "virtiofsd for {} exited: {status} (see the console log)",
                share.source.display()
            )));
        }
        if Instant::now() > deadline {
            return Err(RuntimeError::Start("virtiofsd made no socket".into()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::os::unix::fs::chown(&sock, Some(launch.uid), Some(launch.gid))
        .map_err(RuntimeError::io(format!("chown {}", sock.display())))?;
    Ok(child)
}

/// Makes the child see `source` as a bind mount with the share's flags, in a mount namespace
/// of its own: the host's mounts are untouched and the view dies with the process.
fn private_view(cmd: &mut Command, source: &Path, read_only: bool) -> Result<(), RuntimeError> {
    let src = CString::new(source.as_os_str().as_bytes())
        .map_err(|_| RuntimeError::Start("volume path holds a NUL".into()))?;
    let mut flags =
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    let check = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: the hook runs in the forked child before exec and only makes system calls on
    // memory allocated before the fork (`src`, string literals); unshare and mount are
    // async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let none = std::ptr::null::<libc::c_char>();
            check(libc::unshare(libc::CLONE_NEWNS))?;
            check(libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                src.as_ptr(),
                src.as_ptr(),
                none,
                libc::MS_BIND,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                none,
                src.as_ptr(),
                none,
                flags,
                std::ptr::null(),
            ))
        });
    }
    Ok(())
}

/// QEMU's side of the shares: guest RAM in a shared memory file (vhost-user maps it into
/// virtiofsd), modern virtio-mmio (libvhost-user refuses legacy devices, the `microvm`
/// machine's default), and one `vhost-user-fs-device` per share on its socket.
pub fn qemu_args(launch: &Launch) -> Vec<String> {
    if launch.shares.is_empty() {
        return Vec::new();
    }
    let mut args = vec![
        "-global".into(),
        "virtio-mmio.force-legacy=false".into(),
        "-object".into(),
        format!(
            "memory-backend-memfd,id=mem,size={}M,share=on",
            launch.memory_mib
        ),
    ];
    for n in 0..launch.shares.len() {
        args.extend([
            "-chardev".into(),
            format!("socket,id=fs{n},path={}", socket(&launch.dir, n).display()),
            "-device".into(),
            format!("vhost-user-fs-device,chardev=fs{n},tag={}", tag(n)),
        ]);
    }
    args
}
