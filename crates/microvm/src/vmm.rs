//! What a virtual machine monitor backend is given and gives back. Backends: QEMU's `microvm`
//! machine (KVM or TCG) and Firecracker (KVM only).

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use koder_runtime::RuntimeError;
use serde::{Deserialize, Serialize};

/// How guest code executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Accel {
    /// Hardware virtualization through /dev/kvm.
    Kvm,
    /// QEMU's binary translator: slow, but needs nothing from the host CPU.
    Tcg,
}

/// How the daemon reaches the guest agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentChannel {
    /// virtio-vsock behind the VMM's unix socket, in the `CONNECT <port>` convention
    /// (Firecracker).
    Vsock { uds: PathBuf, port: u32 },
    /// A virtio-serial port called `name` whose host end is the unix socket `socket` the VMM
    /// listens on (QEMU): a migratable device, one byte stream for the guest's life.
    Serial { socket: PathBuf, name: String },
}

/// Everything a backend needs to start one guest. Recorded in the VM's directory: a VM saved
/// to a file comes back on exactly the same machine (devices, sizes, disks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    /// The VM's private directory (sockets, console log, scratch disk), owned by `uid`.
    pub dir: PathBuf,
    /// Unique per VM on this host; names the VM in the VMM's logs.
    pub id: String,
    pub vmlinux: PathBuf,
    pub initrd: PathBuf,
    pub cmdline: String,
    /// Read-only ext4 image; the guest finds it by the serial (Firecracker: drive id)
    /// [`koder_agent_protocol::init::VM_ROOT_DISK_SERIAL`].
    pub root_disk: PathBuf,
    /// Writable raw ext4 disk, serial [`koder_agent_protocol::init::VM_SCRATCH_DISK_SERIAL`].
    pub scratch_disk: PathBuf,
    /// Read-only raw disk of the layers a VM made from a snapshot starts from, serial
    /// [`koder_agent_protocol::init::VM_LAYERS_DISK_SERIAL`].
    pub layers_disk: Option<PathBuf>,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub channel: AgentChannel,
    /// Unprivileged host uid/gid the VMM processes run as.
    pub uid: u32,
    pub gid: u32,
    pub accel: Accel,
    /// Host directories (volumes) the guest mounts over virtio-fs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<Share>,
}

/// A host directory shared with the guest at file level (virtio-fs): the host keeps it mounted
/// for itself too, so it never becomes a block device of the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    pub source: PathBuf,
    /// The name the guest mounts it by.
    pub tag: String,
    /// Read-only on the host side of the share as well, not only in the guest's mount.
    pub read_only: bool,
}

impl Launch {
    /// Where a backend sends the guest's serial console.
    pub fn console_log(&self) -> PathBuf {
        self.dir.join("console.log")
    }

    /// The host end of the guest's vsock (`CONNECT <port>` convention), where it has one.
    pub fn vsock_uds(&self) -> Option<&Path> {
        match &self.channel {
            AgentChannel::Vsock { uds, .. } => Some(uds),
            AgentChannel::Serial { .. } => None,
        }
    }
}

/// The host processes of one running VM; killing them all ends the VM.
pub struct VmProcesses {
    pub children: Vec<tokio::process::Child>,
}

#[async_trait]
pub trait Vmm: Send + Sync {
    fn name(&self) -> &'static str;

    /// Starts the guest and returns once it is booting; the runtime then waits for its agent.
    async fn start(&self, launch: &Launch) -> Result<VmProcesses, RuntimeError>;

    /// The agent channel of a VM whose directory is `dir`.
    fn agent_channel(&self, dir: &Path, vsock_port: u32) -> AgentChannel;

    /// Saving a running VM to a file and starting it again from there, where this backend can.
    fn memory_snapshots(&self) -> Option<&dyn Suspend> {
        None
    }

    /// Whether this backend can share host directories with its guests ([`Launch::shares`]):
    /// `Unsupported` when it has no such device, `Unavailable` when this host lacks a piece.
    fn file_shares(&self) -> Result<(), RuntimeError> {
        Err(RuntimeError::Unsupported(format!(
            "{} has no file-share device (virtio-fs), and a volume the host keeps mounted is \
             never handed to a guest as a block device; volumes need the QEMU backend",
            self.name()
        )))
    }

    /// The serial the guest will see on the disk backed by `path`, which this backend is asked
    /// to label `label`.
    fn disk_serial(&self, _path: &Path, label: &str) -> Result<String, RuntimeError> {
        Ok(label.to_string())
    }
}

/// A backend that can save a running VM to a file and start it again from there. The disks
/// are files already and stay where they are; the file holds guest memory and device state.
#[async_trait]
pub trait Suspend: Send + Sync {
    /// Stops the VM of `launch` and writes its state into `to`. The VMM processes still run
    /// afterwards (stopped); on error the VM carries on as before.
    async fn save(&self, launch: &Launch, to: &std::fs::File) -> Result<(), RuntimeError>;

    /// Starts the VMM of `launch` waiting for a state to load; nothing runs in the guest yet.
    async fn start_paused(&self, launch: &Launch) -> Result<VmProcesses, RuntimeError>;

    /// Loads the state `save` wrote into a VMM `start_paused` started; the guest stays stopped.
    async fn load(&self, launch: &Launch, from: &std::fs::File) -> Result<(), RuntimeError>;

    /// Lets the loaded guest run.
    async fn cont(&self, launch: &Launch) -> Result<(), RuntimeError>;
}

/// A VMM gets its stdio and nothing else the daemon holds (its HTTP listener, agent
/// connections, other VMs' sockets), whatever flags a descriptor was opened with: a VMM
/// outlives a crashed daemon until reconciliation, and must not keep its port or its files.
pub fn stdio_only(cmd: &mut tokio::process::Command) {
    // SAFETY: close_range only changes descriptor flags and is async-signal-safe; pre_exec
    // hooks run after std has placed the child's stdio on 0-2.
    unsafe {
        cmd.pre_exec(|| {
            if libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
