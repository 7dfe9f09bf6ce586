//! QEMU backend: the `microvm` machine (virtio-mmio only, no PCI, no firmware beyond qboot),
//! with virtio-vsock served by `vhost-device-vsock` so the host side speaks the same unix-socket
//! `CONNECT <port>` convention as Firecracker.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use koder_agent_protocol::init::{
    VM_LAYERS_DISK_SERIAL, VM_ROOT_DISK_SERIAL, VM_SCRATCH_DISK_SERIAL,
};
use koder_hostkit::install::install_executable;
use koder_hostkit::mode::set_mode;
use koder_runtime::RuntimeError;
use tokio::process::{Child, Command};

use crate::vmm::{Accel, Launch, VmProcesses, Vmm};

/// The guest CID every VM uses: each VM has its own vhost-device-vsock, so CIDs never meet.
const GUEST_CID: u32 = 3;
const SOCKET_WAIT: Duration = Duration::from_secs(5);

pub struct Qemu {
    qemu: PathBuf,
    vhost_vsock: PathBuf,
}

impl Qemu {
    /// Unavailable (with the reason) unless both programs are installed. `bin_dir` receives a
    /// copy of vhost-device-vsock: `cargo install` puts it below root's home, where the VM's
    /// unprivileged uid cannot execute it.
    pub fn new(qemu: PathBuf, vhost_vsock: PathBuf, bin_dir: &Path) -> Result<Self, RuntimeError> {
        let qemu = find_program(&qemu).ok_or_else(|| {
            RuntimeError::Unavailable(format!(
                "{} not found (install qemu-system-x86: scripts/setup-microvm.sh)",
                qemu.display()
            ))
        })?;
        let vhost_vsock = find_program(&vhost_vsock).ok_or_else(|| {
            RuntimeError::Unavailable(format!(
                "{} not found (cargo install vhost-device-vsock: scripts/setup-microvm.sh)",
                vhost_vsock.display()
            ))
        })?;
        let vhost_vsock = install_program(&vhost_vsock, bin_dir)?;
        Ok(Self { qemu, vhost_vsock })
    }
}

/// Copies `program` into `bin_dir` (world-executable) unless an identical copy is there.
fn install_program(program: &Path, bin_dir: &Path) -> Result<PathBuf, RuntimeError> {
    let name = program
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| RuntimeError::Unavailable(format!("{} is no program", program.display())))?;
    let target = install_executable(program, bin_dir, name)?;
    set_mode(bin_dir, 0o755)?;
    Ok(target)
}

/// `program` itself when it is a path, else its first match on PATH.
pub fn find_program(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([
            PathBuf::from("/root/.cargo/bin"),
            PathBuf::from("/usr/local/bin"),
        ])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

#[async_trait]
impl Vmm for Qemu {
    fn name(&self) -> &'static str {
        "qemu"
    }

    async fn start(&self, launch: &Launch) -> Result<VmProcesses, RuntimeError> {
        let vhost_socket = launch.dir.join("vhost-user.sock");
        let mut vsock = unprivileged(Command::new(&self.vhost_vsock), launch)?;
        // Its warnings are about guest traffic; only errors go to the (host-side) log.
        vsock
            .env("RUST_LOG", "error")
            .arg("--vm")
            .arg(format!(
                "guest-cid={GUEST_CID},socket={},uds-path={}",
                vhost_socket.display(),
                launch.vsock_uds.display()
            ))
            .stderr(log_file(launch)?);
        let mut vsock = vsock
            .spawn()
            .map_err(|e| RuntimeError::Start(format!("start vhost-device-vsock: {e}")))?;
        if let Err(e) = wait_for_socket(&vhost_socket, &mut vsock).await {
            let _ = vsock.start_kill();
            return Err(e);
        }
        let mut qemu = unprivileged(Command::new(&self.qemu), launch)?;
        qemu.args(qemu_args(launch, &vhost_socket))
            .stdout(log_file(launch)?)
            .stderr(log_file(launch)?);
        match qemu.spawn() {
            Ok(qemu) => Ok(VmProcesses {
                children: vec![qemu, vsock],
            }),
            Err(e) => {
                let _ = vsock.start_kill();
                Err(RuntimeError::Start(format!("start qemu: {e}")))
            }
        }
    }
}

/// A VMM process: the VM's unprivileged uid (std drops the supplementary groups when it
/// switches uid), no stdin, killed if the daemon drops it, and in its own process group so
/// signals to the daemon's group (a ^C in a terminal) do not reach it behind the daemon's back.
fn unprivileged(mut cmd: Command, launch: &Launch) -> Result<Command, RuntimeError> {
    cmd.uid(launch.uid)
        .gid(launch.gid)
        .current_dir(&launch.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .process_group(0);
    crate::vmm::stdio_only(&mut cmd);
    Ok(cmd)
}

fn log_file(launch: &Launch) -> Result<Stdio, RuntimeError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(launch.console_log())
        .map(Stdio::from)
        .map_err(RuntimeError::io("open the console log"))
}

async fn wait_for_socket(path: &Path, child: &mut Child) -> Result<(), RuntimeError> {
    let deadline = Instant::now() + SOCKET_WAIT;
    while !path.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(RuntimeError::Start(format!(
                "vhost-device-vsock exited at start ({status})"
            )));
        }
        if Instant::now() > deadline {
            return Err(RuntimeError::Start(
                "vhost-device-vsock did not create its socket".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// The QEMU command line for one guest.
pub fn qemu_args(launch: &Launch, vhost_socket: &Path) -> Vec<String> {
    let mem = format!("{}M", launch.memory_mib);
    let (accel, cpu) = match launch.accel {
        Accel::Kvm => ("kvm", "host"),
        // TCG's translation cache defaults to 1 GiB and grows into it; 64 MiB holds a
        // sandbox's working set of translated code at a fraction of the host memory.
        Accel::Tcg => ("tcg,tb-size=64", "max"),
    };
    let p = |p: &Path| p.display().to_string();
    let mut args: Vec<String> = vec![
        "-name".into(),
        format!("koder-{}", launch.id),
        // vhost-user needs guest memory the backend can map: a shared memfd.
        "-machine".into(),
        "microvm,memory-backend=mem".into(),
        "-object".into(),
        format!("memory-backend-memfd,id=mem,size={mem},share=on"),
        "-m".into(),
        mem,
        "-accel".into(),
        accel.into(),
        "-cpu".into(),
        cpu.into(),
        "-smp".into(),
        launch.vcpus.max(1).to_string(),
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-nographic".into(),
        "-no-reboot".into(),
        "-serial".into(),
        "stdio".into(),
        // QEMU's own seccomp filter: a guest that escapes into QEMU still cannot spawn
        // programs, raise privileges or use obsolete syscalls.
        "-sandbox".into(),
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny".into(),
        "-kernel".into(),
        p(&launch.vmlinux),
        "-initrd".into(),
        p(&launch.initrd),
        "-append".into(),
        launch.cmdline.clone(),
        "-drive".into(),
        format!(
            "id=root,file={},format=raw,if=none,readonly=on,cache=unsafe",
            p(&launch.root_disk)
        ),
        "-device".into(),
        format!("virtio-blk-device,drive=root,serial={VM_ROOT_DISK_SERIAL}"),
        "-drive".into(),
        format!(
            "id=scratch,file={},format=raw,if=none,cache=unsafe,discard=unmap",
            p(&launch.scratch_disk)
        ),
        "-device".into(),
        format!("virtio-blk-device,drive=scratch,serial={VM_SCRATCH_DISK_SERIAL}"),
        "-chardev".into(),
        format!("socket,id=vsock,path={}", p(vhost_socket)),
        "-device".into(),
        "vhost-user-vsock-device,chardev=vsock".into(),
    ];
    if let Some(layers) = &launch.layers_disk {
        args.extend([
            "-drive".into(),
            format!(
                "id=layers,file={},format=raw,if=none,readonly=on,cache=unsafe",
                p(layers)
            ),
            "-device".into(),
            format!("virtio-blk-device,drive=layers,serial={VM_LAYERS_DISK_SERIAL}"),
        ]);
    }
    // No NIC: the guest has loopback only (network `none`).
    args.extend(["-net".into(), "none".into()]);
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> Launch {
        Launch {
            dir: "/state/vms/a".into(),
            id: "a".into(),
            vmlinux: "/img/vmlinux".into(),
            initrd: "/state/vms/a/initrd".into(),
            cmdline: "console=ttyS0 quiet".into(),
            root_disk: "/img/rootfs.ext4".into(),
            scratch_disk: "/state/vms/a/scratch.ext4".into(),
            layers_disk: None,
            vcpus: 2,
            memory_mib: 640,
            vsock_uds: "/state/vms/a/vsock.sock".into(),
            uid: 150_000,
            gid: 150_000,
            accel: Accel::Tcg,
        }
    }

    fn after<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].as_str())
            .collect()
    }

    #[test]
    fn command_line() {
        let args = qemu_args(&launch(), Path::new("/state/vms/a/vhost-user.sock"));
        assert_eq!(after(&args, "-accel"), ["tcg,tb-size=64"]);
        assert_eq!(after(&args, "-cpu"), ["max"]);
        assert_eq!(after(&args, "-smp"), ["2"]);
        assert_eq!(after(&args, "-m"), ["640M"]);
        assert_eq!(after(&args, "-append"), ["console=ttyS0 quiet"]);
        assert_eq!(after(&args, "-net"), ["none"]);
        let drives = after(&args, "-drive");
        assert!(drives[0].contains("file=/img/rootfs.ext4") && drives[0].contains("readonly=on"));
        assert!(!drives[1].contains("readonly"));
        let devices = after(&args, "-device");
        assert!(devices.contains(&"virtio-blk-device,drive=root,serial=koder-root"));
        assert!(devices.contains(&"virtio-blk-device,drive=scratch,serial=koder-scratch"));
        assert!(after(&args, "-object")[0].contains("share=on"));
        assert!(!args.iter().any(|a| a.contains("layers")));
        let mut restored = launch();
        restored.layers_disk = Some("/state/vms/a/layers.img".into());
        let args = qemu_args(&restored, Path::new("/v"));
        let drives = after(&args, "-drive");
        assert!(
            drives[2].contains("file=/state/vms/a/layers.img") && drives[2].contains("readonly=on"),
            "{drives:?}"
        );
        assert!(
            after(&args, "-device").contains(&"virtio-blk-device,drive=layers,serial=koder-layers")
        );
        let mut kvm = launch();
        kvm.accel = Accel::Kvm;
        let args = qemu_args(&kvm, Path::new("/v"));
        assert_eq!(after(&args, "-accel"), ["kvm"]);
        assert_eq!(after(&args, "-cpu"), ["host"]);
    }

    #[test]
    fn missing_programs_are_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let err = Qemu::new(
            "/nonexistent/qemu".into(),
            "vhost-device-vsock".into(),
            dir.path(),
        )
        .err()
        .unwrap();
        assert!(matches!(err, RuntimeError::Unavailable(m) if m.contains("/nonexistent/qemu")));
    }
}
