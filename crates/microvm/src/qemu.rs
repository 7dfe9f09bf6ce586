//! QEMU backend: the `microvm` machine (virtio-mmio only, no PCI, no firmware beyond qboot).
//! The agent channel is a virtio-serial port whose host end is a unix socket QEMU listens on,
//! and the VM has a QMP monitor: every device migrates, so a running VM can be saved to a file
//! (memory and device state; its disks are files already) and started again from it.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use koder_agent_protocol::init::{
    VM_LAYERS_DISK_SERIAL, VM_ROOT_DISK_SERIAL, VM_SCRATCH_DISK_SERIAL,
};
use koder_runtime::RuntimeError;
use serde_json::json;
use tokio::process::Command;

use crate::qmp::{Qmp, QmpError};
use crate::vmm::{Accel, AgentChannel, Launch, Suspend, VmProcesses, Vmm};

/// The name the guest finds its agent's virtio-serial port by.
pub const AGENT_PORT_NAME: &str = "koder.agent";
/// QEMU's monitor socket in the VM's directory.
const QMP_SOCKET: &str = "qmp.sock";
/// The agent channel's socket in the VM's directory.
const AGENT_SOCKET: &str = "agent.sock";
/// The name the snapshot file's descriptor has in QEMU.
const SNAPSHOT_FD: &str = "snapshot";
/// QEMU creates its sockets at start.
const SOCKET_WAIT: Duration = Duration::from_secs(10);
/// Saving or loading guest RAM; TCG hosts write a few hundred MiB/s.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(300);

pub struct Qemu {
    qemu: PathBuf,
    /// The file-share server, where installed: without it VMs have no volumes.
    virtiofsd: Option<PathBuf>,
}

impl Qemu {
    /// Unavailable (with the reason) unless QEMU is installed.
    pub fn new(qemu: PathBuf) -> Result<Self, RuntimeError> {
        let qemu = find_program(&qemu).ok_or_else(|| {
            RuntimeError::Unavailable(format!(
                "{} not found (install qemu-system-x86: scripts/setup-microvm.sh)",
                qemu.display()
            ))
        })?;
        Ok(Self {
            qemu,
            virtiofsd: crate::virtiofs::find(),
        })
    }

    async fn spawn(&self, launch: &Launch, incoming: bool) -> Result<VmProcesses, RuntimeError> {
        for stale in [QMP_SOCKET, AGENT_SOCKET] {
            let _ = std::fs::remove_file(launch.dir.join(stale));
        }
        let mut children = Vec::with_capacity(launch.shares.len() + 1);
        for (n, share) in launch.shares.iter().enumerate() {
            let virtiofsd = self.virtiofsd.as_deref().ok_or_else(no_virtiofsd)?;
            children.push(
                crate::virtiofs::spawn(virtiofsd, launch, n, share, log_file(launch)?).await?,
            );
        }
        let mut qemu = unprivileged(Command::new(&self.qemu), launch)?;
        qemu.args(qemu_args(launch, incoming))
            .stdout(log_file(launch)?)
            .stderr(log_file(launch)?);
        let qemu = qemu
            .spawn()
            .map_err(|e| RuntimeError::Start(format!("start qemu: {e}")))?;
        children.push(qemu);
        Ok(VmProcesses { children })
    }
}

fn no_virtiofsd() -> RuntimeError {
    RuntimeError::Unavailable(
        "virtiofsd not found (volumes on microVMs need it: scripts/install-missing.sh)".into(),
    )
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
        self.spawn(launch, false).await
    }

    fn agent_channel(&self, dir: &Path, _vsock_port: u32) -> AgentChannel {
        AgentChannel::Serial {
            socket: dir.join(AGENT_SOCKET),
            name: AGENT_PORT_NAME.into(),
        }
    }

    fn memory_snapshots(&self) -> Option<&dyn Suspend> {
        Some(self)
    }

    fn file_shares(&self) -> Result<(), RuntimeError> {
        self.virtiofsd.as_ref().map(|_| ()).ok_or_else(no_virtiofsd)
    }
}

async fn monitor(launch: &Launch) -> Result<Qmp, RuntimeError> {
    Qmp::connect(&launch.dir.join(QMP_SOCKET), Instant::now() + SOCKET_WAIT)
        .await
        .map_err(qmp_err)
}

fn qmp_err(e: QmpError) -> RuntimeError {
    RuntimeError::Start(format!("qemu monitor: {e}"))
}

/// QEMU writes the migration stream into a descriptor it is given (`getfd` + `fd:` URI): it
/// may not spawn a helper (`-sandbox spawn=deny`) and cannot open the daemon's files.
#[async_trait]
impl Suspend for Qemu {
    async fn save(&self, launch: &Launch, to: &std::fs::File) -> Result<(), RuntimeError> {
        let mut qmp = monitor(launch).await?;
        // Stopped first: one pass over memory, and the disks see no write after the state.
        qmp.execute("stop", json!({})).await.map_err(qmp_err)?;
        let saved = async {
            qmp.execute_with_fd("getfd", json!({ "fdname": SNAPSHOT_FD }), Some(to.as_fd()))
                .await?;
            qmp.execute("migrate", json!({ "uri": format!("fd:{SNAPSHOT_FD}") }))
                .await?;
            qmp.wait_migration(Instant::now() + MIGRATION_TIMEOUT).await
        }
        .await;
        if let Err(e) = saved {
            // The VM carries on as it was.
            let _ = qmp.execute("cont", json!({})).await;
            return Err(qmp_err(e));
        }
        Ok(())
    }

    async fn start_paused(&self, launch: &Launch) -> Result<VmProcesses, RuntimeError> {
        self.spawn(launch, true).await
    }

    async fn load(&self, launch: &Launch, from: &std::fs::File) -> Result<(), RuntimeError> {
        let mut qmp = monitor(launch).await?;
        qmp.execute_with_fd(
            "getfd",
            json!({ "fdname": SNAPSHOT_FD }),
            Some(from.as_fd()),
        )
        .await
        .map_err(qmp_err)?;
        qmp.execute(
            "migrate-incoming",
            json!({ "uri": format!("fd:{SNAPSHOT_FD}") }),
        )
        .await
        .map_err(qmp_err)?;
        qmp.wait_migration(Instant::now() + MIGRATION_TIMEOUT)
            .await
            .map_err(qmp_err)
    }

    async fn cont(&self, launch: &Launch) -> Result<(), RuntimeError> {
        let mut qmp = monitor(launch).await?;
        qmp.execute("cont", json!({})).await.map_err(qmp_err)?;
        Ok(())
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

/// The QEMU command line for one guest; `incoming`: started paused, waiting for its state
/// from a file (`migrate-incoming`), on exactly the machine it was saved from.
pub fn qemu_args(launch: &Launch, incoming: bool) -> Vec<String> {
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
        "-machine".into(),
        if launch.shares.is_empty() {
            "microvm".into()
        } else {
            "microvm,memory-backend=mem".into()
        },
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
        // The agent channel: a virtio-serial port on a socket QEMU serves (wait=off: the
        // guest runs whether or not the daemon is connected).
        "-device".into(),
        "virtio-serial-device".into(),
        "-chardev".into(),
        format!(
            "socket,id=agent,path={},server=on,wait=off",
            p(&launch.dir.join(AGENT_SOCKET))
        ),
        "-device".into(),
        format!("virtserialport,chardev=agent,name={AGENT_PORT_NAME}"),
        "-qmp".into(),
        format!(
            "unix:{},server=on,wait=off",
            p(&launch.dir.join(QMP_SOCKET))
        ),
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
    args.extend(crate::virtiofs::qemu_args(launch));
    // No NIC: the guest has loopback only (network `none`).
    args.extend(["-net".into(), "none".into()]);
    if incoming {
        args.extend(["-incoming".into(), "defer".into()]);
    }
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
            channel: AgentChannel::Serial {
                socket: "/state/vms/a/agent.sock".into(),
                name: AGENT_PORT_NAME.into(),
            },
            uid: 150_000,
            gid: 150_000,
            accel: Accel::Tcg,
            shares: Vec::new(),
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
        let args = qemu_args(&launch(), false);
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
        // Every device migrates: no vhost-user, no shared memory backend.
        assert!(devices.contains(&"virtio-serial-device"));
        assert!(devices.contains(&"virtserialport,chardev=agent,name=koder.agent"));
        assert!(!args
            .iter()
            .any(|a| a.contains("vhost") || a.contains("memfd")));
        assert_eq!(
            after(&args, "-chardev"),
            ["socket,id=agent,path=/state/vms/a/agent.sock,server=on,wait=off"]
        );
        assert_eq!(
            after(&args, "-qmp"),
            ["unix:/state/vms/a/qmp.sock,server=on,wait=off"]
        );
        assert!(after(&args, "-sandbox")[0].contains("spawn=deny"));
        assert!(after(&args, "-incoming").is_empty());
        assert!(after(&args, "-global").is_empty());
        assert!(!args.iter().any(|a| a.contains("layers")));
        let mut restored = launch();
        restored.layers_disk = Some("/state/vms/a/layers.img".into());
        let args = qemu_args(&restored, true);
        assert_eq!(after(&args, "-incoming"), ["defer"]);
        let drives = after(&args, "-drive");
        assert!(
            drives[2].contains("file=/state/vms/a/layers.img") && drives[2].contains("readonly=on"),
            "{drives:?}"
        );
        assert!(
            after(&args, "-device").contains(&"virtio-blk-device,drive=layers,serial=koder-layers")
        );
        let mut shared = launch();
        shared.shares = vec![crate::vmm::Share {
            source: "/data/volumes/v".into(),
            tag: "unused".into(),
            read_only: true,
        }];
        let args = qemu_args(&shared, false);
        assert_eq!(after(&args, "-machine"), ["microvm,memory-backend=mem"]);
        assert_eq!(after(&args, "-global"), ["virtio-mmio.force-legacy=false"]);
        assert_eq!(
            after(&args, "-object"),
            ["memory-backend-memfd,id=mem,size=640M,share=on"]
        );
        assert!(after(&args, "-device")
            .contains(&"vhost-user-fs-device,chardev=fs0,tag=koder-volume-0"));
        assert!(after(&args, "-chardev").contains(&"socket,id=fs0,path=/state/vms/a/fs0.sock"));
        let mut kvm = launch();
        kvm.accel = Accel::Kvm;
        let args = qemu_args(&kvm, false);
        assert_eq!(after(&args, "-accel"), ["kvm"]);
        assert_eq!(after(&args, "-cpu"), ["host"]);
    }

    #[test]
    fn missing_programs_are_unavailable() {
        let err = Qemu::new("/nonexistent/qemu".into()).err().unwrap();
        assert!(matches!(err, RuntimeError::Unavailable(m) if m.contains("/nonexistent/qemu")));
    }
}
