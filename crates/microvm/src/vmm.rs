//! What a virtual machine monitor backend is given and gives back. Backends: QEMU's `microvm`
//! machine (KVM or TCG) and Firecracker (KVM only).

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use koder_runtime::RuntimeError;

/// How guest code executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization through /dev/kvm.
    Kvm,
    /// QEMU's binary translator: slow, but needs nothing from the host CPU.
    Tcg,
}

/// Everything a backend needs to start one guest.
#[derive(Debug, Clone)]
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
    /// Host end of the guest's vsock: a unix socket that speaks the `CONNECT <port>` convention.
    pub vsock_uds: PathBuf,
    /// Unprivileged host uid/gid the VMM processes run as.
    pub uid: u32,
    pub gid: u32,
    pub accel: Accel,
}

impl Launch {
    /// Where a backend sends the guest's serial console.
    pub fn console_log(&self) -> PathBuf {
        self.dir.join("console.log")
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

    /// The serial the guest will see on the disk backed by `path`, which this backend is asked
    /// to label `label`.
    fn disk_serial(&self, _path: &Path, label: &str) -> Result<String, RuntimeError> {
        Ok(label.to_string())
    }
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
