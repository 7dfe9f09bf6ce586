//! How a runtime tells the agent to build its sandbox before serving.
//!
//! The jail runtime passes this as JSON on a sealed memfd ([`CONFIG_FD`]); the agent is then
//! PID 1 of fresh namespaces and turns it into mounts, confinement and a listening socket.

use serde::{Deserialize, Serialize};

/// File descriptor on which the agent finds its already-bound listening socket.
pub const LISTEN_FD: i32 = 3;

/// File descriptor from which the agent reads its [`InitConfig`] (JSON) once at start: not in
/// argv, where the sandbox (`/proc/1/cmdline`) and every host `ps` could read it.
pub const CONFIG_FD: i32 = 4;

/// First of [`InitConfig::workload_cgroup_fds`] descriptors, each a `cgroup.procs` file of the
/// sandbox's workload cgroup (one per cgroup-v1 hierarchy, one on v2) opened for writing by the
/// runtime: every process the agent starts writes `0` into each before exec, so sandbox code
/// runs in the workload group while the agent stays above it, outside its OOM domain.
pub const WORKLOAD_CGROUP_FD: i32 = 5;
/// At most one per v1 controller hierarchy the runtime uses (memory, cpu, cpuacct, pids,
/// freezer).
pub const MAX_WORKLOAD_CGROUP_FDS: u32 = 5;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitConfig {
    pub hostname: String,
    /// Host directory where the sandbox root is assembled before `pivot_root`.
    pub root_target: String,
    /// Read-only lower layer(s) of the root overlay, top first.
    pub image_layers: Vec<String>,
    /// Per-session writable upper layer and overlay work dir (same filesystem).
    pub upper_dir: String,
    pub work_dir: String,
    /// Host paths bound read-only into the sandbox (e.g. the host's /usr for the `host` image).
    pub ro_binds: Vec<Bind>,
    pub tmp_size_mib: u64,
    /// Default working directory of execs and base of relative file paths.
    pub workdir: String,
    /// Base environment of every exec.
    pub env: Vec<(String, String)>,
    /// In-sandbox directories Landlock lets processes write below; everything else is read-only.
    pub writable_dirs: Vec<String>,
    pub rlimits: Rlimits,
    /// Outgoing connections are redirected to the agent and decided by the daemon; without it
    /// the sandbox has loopback only.
    #[serde(default)]
    pub egress: bool,
    /// How many workload `cgroup.procs` descriptors sit from [`WORKLOAD_CGROUP_FD`] on; 0 when
    /// the runtime has no cgroups (rootless).
    #[serde(default)]
    pub workload_cgroup_fds: u32,
    /// Volumes the agent mounts into the root, after every other mount.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<InitVolume>,
    /// Captured session layers between `upper_dir` and `image_layers`, top first: host paths of
    /// read-only mounts the runtime prepared (id-mapped onto the sandbox's ids, as volumes are),
    /// which the agent clones before its pivot and stacks as lower layers of the root overlay.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_mounts: Vec<String>,
}

/// One volume for the agent to mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitVolume {
    /// Host path of the volume's root, already id-mapped onto the sandbox's ids by the runtime;
    /// the agent clones it before the pivot, while host paths are still reachable.
    pub source: String,
    /// Path inside the sandbox; the agent checks it again ([`crate::check_mount_target`]).
    pub target: String,
    pub read_only: bool,
}

/// Where the agent listens for redirected TCP inside the sandbox.
pub const EGRESS_PORT: u16 = 15001;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    pub source: String,
    /// Path inside the sandbox.
    pub target: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimits {
    pub nofile: u64,
    pub nproc: u64,
    pub core: u64,
}

/// What a microVM's agent needs beyond the kernel: found at [`VM_CONFIG_PATH`] in the guest's
/// initramfs (the runtime appends it to the shared base archive per VM).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmConfig {
    pub hostname: String,
    pub workdir: String,
    pub env: Vec<(String, String)>,
    pub writable_dirs: Vec<String>,
    pub rlimits: Rlimits,
    pub tmp_size_mib: u64,
    /// The agent listens on this vsock port for the daemon's one connection.
    pub vsock_port: u32,
    pub limits: crate::messages::GuestLimits,
    /// Serial numbers (`/sys/block/vdX/serial`) of the read-only image disk and of the scratch
    /// disk holding the writable layer: QEMU sets them, Firecracker derives them from the
    /// backing files, so the runtime says which to look for.
    pub root_disk_serial: String,
    pub scratch_disk_serial: String,
    /// Network access mediated by the agent, as in a jail (the guest has no network device).
    #[serde(default)]
    pub egress: bool,
    /// Captured layers the writable layer starts from (a sandbox made from a snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<VmLayers>,
}

/// The layers of a microVM made from a snapshot: `koder-layer` tar streams laid end to end on
/// one read-only raw disk, applied in order onto the empty upper directory before the overlay
/// is mounted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmLayers {
    /// Serial the guest finds the disk by (see [`VmConfig::root_disk_serial`]).
    pub disk_serial: String,
    /// Byte length of each stream, bottom layer first; each starts where the one before ends.
    pub sizes: Vec<u64>,
    /// Most file content one layer may hold: the disk quota.
    pub max_bytes: u64,
}

/// What the guest agent prints on its console once it listens on vsock; the runtime waits for
/// it before the first connection.
pub const VM_READY_LINE: &str = "koder-agent: ready on vsock port";

/// Where the guest agent reads its [`VmConfig`].
pub const VM_CONFIG_PATH: &str = "/koder/config.json";
/// Kernel modules to load before anything else, in order, one file name per line; the files
/// sit next to it.
pub const VM_MODULES_LIST: &str = "/koder/modules/order";
/// Modules loaded after those of [`VM_MODULES_LIST`] when the guest has egress.
pub const VM_EGRESS_MODULES_LIST: &str = "/koder/modules/egress";
/// Serial numbers QEMU gives the guest's disks: the read-only image and the session's scratch
/// disk (the writable overlay layer).
pub const VM_ROOT_DISK_SERIAL: &str = "koder-root";
pub const VM_SCRATCH_DISK_SERIAL: &str = "koder-scratch";
/// Serial of the read-only disk holding [`VmLayers`].
pub const VM_LAYERS_DISK_SERIAL: &str = "koder-layers";

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime that knows nothing of volumes still configures an agent that does.
    #[test]
    fn volume_mounts_default_to_none() {
        let cfg = InitConfig {
            hostname: "h".into(),
            root_target: "/r".into(),
            image_layers: vec!["/l".into()],
            upper_dir: "/u".into(),
            work_dir: "/w".into(),
            ro_binds: Vec::new(),
            tmp_size_mib: 1,
            workdir: "/workspace".into(),
            env: Vec::new(),
            writable_dirs: Vec::new(),
            rlimits: Rlimits {
                nofile: 1,
                nproc: 1,
                core: 0,
            },
            egress: false,
            workload_cgroup_fds: 0,
            volume_mounts: Vec::new(),
            layer_mounts: Vec::new(),
        };
        let json = serde_json::to_string(&cfg).expect("encode");
        assert!(!json.contains("volume_mounts") && !json.contains("layer_mounts"));
        assert_eq!(
            serde_json::from_str::<InitConfig>(&json).expect("decode"),
            cfg
        );
        let with = InitConfig {
            volume_mounts: vec![InitVolume {
                source: "/s/volumes/0".into(),
                target: "/data".into(),
                read_only: true,
            }],
            layer_mounts: vec!["/s/layers/0".into()],
            ..cfg
        };
        let json = serde_json::to_string(&with).expect("encode");
        assert_eq!(
            serde_json::from_str::<InitConfig>(&json).expect("decode"),
            with
        );
    }
}
