//! The microVM runtime: every sandbox is its own virtual machine (QEMU `microvm` or Firecracker)
//! booting a distribution kernel whose init is the koder agent. The daemon talks to the agent
//! over a virtio-serial port (QEMU) or virtio-vsock (Firecracker) with the same protocol a jail
//! uses, so every API works unchanged; the guest's own cgroup, driven by the agent, carries the
//! session's limits inside a VM sized to the server's maximum. A VM boots its session's image
//! from a read-only root disk shared by every VM on it: the `host` image's from [`image`], a
//! store image's built from its tree by [`disk`].
//!
//! Host side of one VM: a private directory `<state>/vms/<id>` (owned by the VM's unprivileged
//! uid) with its initrd (shared base + its config), a sparse scratch disk (the guest's writable
//! layer, sized to the disk quota), for a VM made from a snapshot a read-only disk of its
//! layers ([`layers`]), the agent and monitor sockets, the console log and the record of how
//! it was launched; the VMM processes run as that uid. Destroying the VM kills them and removes
//! the directory.
//!
//! On QEMU a VM can be suspended ([`MemorySnapshot`]): its memory and device state go to
//! `memory.snap` in its directory (written as `memory.partial`, fsynced, renamed: a file by that
//! name is always complete), its processes end and its uid is given back; a later resume (also
//! after a daemon restart) starts QEMU on the same machine from that file, deletes the file
//! before the guest runs again (from then on its disks move on) and reconnects to the agent.

pub mod disk;
pub mod firecracker;
pub mod image;
pub mod initrd;
pub mod kernel;
pub mod kvm;
pub mod layers;
pub mod qemu;
pub mod qmp;
pub mod serial;
pub mod virtiofs;
pub mod vmm;
pub mod vsock;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use koder_agent_protocol::init::{
    Rlimits, VmConfig, VmLayers, VmVolume, VM_LAYERS_DISK_SERIAL, VM_READY_LINE,
    VM_ROOT_DISK_SERIAL, VM_SCRATCH_DISK_SERIAL,
};
use koder_agent_protocol::{AgentClient, GuestLimits};
use koder_cgroups::{Cgroup, CgroupDriver};
use koder_hostkit::ext4;
use koder_hostkit::mode::set_mode;
use koder_hostkit::reap::{self, ExeMatch};
use koder_runtime::slots::Slots;
use koder_runtime::{
    validate_id, Enforcement, Limits, MemorySnapshot, NotEnforced, ReconcileReport,
    ResourceControl, Runtime, RuntimeError, Sandbox, SandboxSpec, Usage,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::process::Child;

use crate::vmm::{Accel, AgentChannel, Launch, Vmm};

/// vsock port the guest agent listens on.
pub const AGENT_VSOCK_PORT: u32 = 1024;
/// Guest memory beyond the sandbox's own limit: kernel, page cache for the image, the agent.
pub const GUEST_OVERHEAD_MIB: u64 = 160;
const DEFAULT_DISK_MIB: u64 = 2048;
/// Host memory a VMM needs beyond its guest's RAM (QEMU's mappings and heap, the TCG
/// translation cache).
const VMM_OVERHEAD_MIB: u64 = 320;
/// Threads of one VM's VMM processes (QEMU's vCPU, I/O and RCU threads).
const VMM_PIDS: u64 = 256;
/// How the agent's own console lines start (sandbox code has no console device).
const AGENT_CONSOLE_PREFIX: &str = "koder-agent: ";
/// How much of the end of a console log is read.
const CONSOLE_TAIL_BYTES: u64 = 64 * 1024;
/// One connect + handshake + health check of a booted guest.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(5);

/// Which VMM runs the guests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// Firecracker where it and hardware KVM are available, otherwise QEMU.
    #[default]
    Auto,
    Qemu,
    Firecracker,
}

#[derive(Debug, Clone)]
pub struct MicroVmConfig {
    /// This runtime's own directory: per-VM directories, the guest initrd.
    pub state_dir: PathBuf,
    /// Where `ksandbox image build --microvm` put the kernel and root disk (shared by daemons).
    pub images_dir: PathBuf,
    /// The image store sandbox specs name images of (language packs, templates, imports); each
    /// image's root disk is built there, beside its tree ([`disk`]). `None`: `host` only.
    pub images: Option<koder_image::ImageStore>,
    pub agent_bin: PathBuf,
    pub backend: Backend,
    pub qemu_bin: PathBuf,
    pub firecracker_bin: PathBuf,
    /// First host uid/gid of VMM processes; VM `n` runs as `uid_base + n`.
    pub uid_base: u32,
    pub max_vms: u32,
    pub default_limits: Limits,
    /// Memory every VM is sized for (more when its session asks for more), so a warm VM can take
    /// most sessions' limits; untouched guest memory costs the host nothing.
    pub vm_memory_mib: u64,
    pub tmp_size_mib: u64,
    /// From VMM start to a healthy agent; TCG boots take seconds.
    pub boot_timeout: Duration,
    /// Host cgroup directory holding one cgroup per VM for its VMM processes (memory, CPU and
    /// pids caps on the host side); `None`, or a host without usable cgroups, goes without.
    pub cgroup_parent: Option<String>,
}

impl MicroVmConfig {
    pub fn new(
        state_dir: impl Into<PathBuf>,
        images_dir: impl Into<PathBuf>,
        agent_bin: impl Into<PathBuf>,
    ) -> Self {
        Self {
            state_dir: state_dir.into(),
            images_dir: images_dir.into(),
            images: None,
            agent_bin: agent_bin.into(),
            backend: Backend::Auto,
            qemu_bin: "qemu-system-x86_64".into(),
            firecracker_bin: "firecracker".into(),
            uid_base: 150_000,
            max_vms: 64,
            default_limits: Limits {
                cpu_millis: Some(1000),
                memory_mib: Some(512),
                pids: Some(256),
                disk_mib: None,
            },
            vm_memory_mib: 1024,
            tmp_size_mib: 256,
            boot_timeout: Duration::from_secs(60),
            cgroup_parent: Some("koder-sandbox".into()),
        }
    }
}

pub struct MicroVmRuntime {
    cfg: MicroVmConfig,
    vmm: Arc<dyn Vmm>,
    accel: Accel,
    image: image::VmImage,
    initrd_base: PathBuf,
    /// Empty ext4 filesystems, one per disk size, that scratch disks are copied from.
    scratch_templates: ext4::Templates,
    slots: Slots,
    enforcement: Enforcement,
    /// Host TSC frequency for the guest command line: a TCG guest that calibrates its TSC
    /// itself hangs in one boot out of three.
    tsc_khz: Option<u64>,
    /// Boots are CPU-bound (under TCG, seconds of it): more at once than there are host CPUs
    /// only slows every one of them towards its deadline, so the rest wait their turn.
    boot_permits: tokio::sync::Semaphore,
    cgroups: Option<Box<dyn CgroupDriver>>,
    /// Prefix of this runtime's cgroup names (from its state dir: daemons sharing a parent
    /// never reconcile each other's VMs).
    cgroup_prefix: String,
    /// One lock per store image whose root disk was needed: the first VM on an image builds
    /// its disk, the ones created meanwhile wait and find it.
    disk_builds: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// What a VM boots: an image's root disk and the environment its processes start with.
struct Root {
    disk: PathBuf,
    env: Vec<(String, String)>,
    /// Where the agent and execs start, writable besides the usual directories.
    workdir: String,
}

impl MicroVmRuntime {
    /// Checks the VMM, the accelerator and the image, and packs the guest initrd around this
    /// daemon's agent. `Unavailable` (with the reason) when this host cannot run microVMs.
    pub fn new(cfg: MicroVmConfig) -> Result<Self, RuntimeError> {
        let image =
            image::load(&cfg.images_dir).map_err(|e| RuntimeError::Unavailable(e.to_string()))?;
        let (accel, no_kvm) = vmm_accel(kvm::accel());
        let vmm = select_vmm(&cfg, no_kvm.as_deref())?;
        for dir in [cfg.state_dir.clone(), vms_dir(&cfg)] {
            std::fs::create_dir_all(&dir)
                .map_err(RuntimeError::io(format!("create {}", dir.display())))?;
            set_mode(&dir, 0o711)?;
        }
        let initrd_base = cfg.state_dir.join("initrd-base.cpio");
        let agent = guest_agent(&cfg.agent_bin, &cfg.state_dir)?;
        initrd::write_base(&initrd_base, &agent, &image)
            .map_err(|e| RuntimeError::Unavailable(format!("guest initrd: {e}")))?;
        set_mode(&initrd_base, 0o644)?;
        let mut enforcement = Enforcement {
            enforced: vec![
                format!(
                    "separate guest kernel ({}) per sandbox",
                    image.kernel_version
                ),
                format!(
                    "{} VMM processes under a per-VM unprivileged uid",
                    vmm.name()
                ),
                "read-only root disk, per-VM scratch disk sized to the disk quota".into(),
                "guest cgroup limits: memory, cpu, pids".into(),
                "seccomp, landlock, no_new_privs inside the guest".into(),
                "no network device: loopback only, or egress mediated by the agent over its channel"
                    .into(),
            ],
            not_enforced: Vec::new(),
        };
        let cgroups = host_cgroups(&cfg, &mut enforcement);
        match accel {
            Accel::Kvm => enforcement
                .enforced
                .push("hardware virtualization (KVM)".into()),
            Accel::Tcg => enforcement.not_enforced.push(NotEnforced {
                what: "hardware virtualization".into(),
                why: format!(
                    "{}; guests run under QEMU's TCG emulator (isolated, but slow to boot and run)",
                    no_kvm.unwrap_or_else(|| "KVM unusable".into())
                ),
            }),
        }
        Ok(Self {
            slots: Slots::new(cfg.max_vms),
            scratch_templates: ext4::Templates::new(cfg.state_dir.join("scratch-templates")),
            tsc_khz: host_tsc_khz(),
            boot_permits: tokio::sync::Semaphore::new(host_cpus() as usize),
            cgroups,
            cgroup_prefix: koder_cgroups::instance_prefix(&cfg.state_dir),
            disk_builds: Mutex::default(),
            cfg,
            vmm,
            accel,
            image,
            initrd_base,
            enforcement,
        })
    }

    /// `dest` as a sparse copy of the empty ext4 filesystem of `mib` (built on first use).
    async fn scratch_disk(&self, mib: u64, dest: &Path) -> Result<(), RuntimeError> {
        let templates = self.scratch_templates.clone();
        let dest = dest.to_path_buf();
        // mkfs and the copy block for a while: not on a worker other VMs' requests wait for.
        tokio::task::spawn_blocking(move || templates.instantiate(mib, &dest).map(drop))
            .await
            .map_err(|e| RuntimeError::Start(format!("scratch disk task: {e}")))?
    }

    /// The disk of `spec.layers` in `dir` and what the guest needs to apply them; `None` for
    /// a sandbox that starts empty.
    async fn layers_disk(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        disk_mib: u64,
    ) -> Result<Option<(PathBuf, VmLayers)>, RuntimeError> {
        if spec.disk.is_some() {
            return Err(RuntimeError::InvalidSpec(
                "a microVM does not start from another sandbox's cloned disk".into(),
            ));
        }
        if spec.layers.is_empty() {
            return Ok(None);
        }
        if let Some(tree) = spec.layers.iter().find(|l| l.is_dir()) {
            return Err(RuntimeError::InvalidSpec(format!(
                "a microVM takes layers as files, not the jail's copied tree {}",
                tree.display()
            )));
        }
        let disk = dir.join(layers::DISK_FILE);
        let (files, dest) = (spec.layers.clone(), disk.clone());
        // Copies of up to the disk quota each: not on a worker other requests wait for.
        let sizes = tokio::task::spawn_blocking(move || layers::stack(&files, &dest))
            .await
            .map_err(|e| RuntimeError::Start(format!("layers disk task: {e}")))??;
        let vm_layers = VmLayers {
            disk_serial: self.vmm.disk_serial(&disk, VM_LAYERS_DISK_SERIAL)?,
            sizes,
            max_bytes: disk_mib.saturating_mul(1 << 20),
        };
        Ok(Some((disk, vm_layers)))
    }

    fn cmdline(&self) -> String {
        let mut cmdline =
            // reboot=k and panic=-1: a guest that panics or reboots ends its VMM (QEMU runs with
            // -no-reboot); there is no PCI on either machine model. loglevel=1: only emergencies
            // (a panic) reach the console, not the per-OOM-kill lines a sandbox could cause
            // without end, so the host-side log stays small.
            "console=ttyS0 loglevel=1 panic=-1 reboot=k pci=off random.trust_cpu=on i8042.noaux i8042.nokbd"
                .to_string();
        // Only for TCG: under KVM the guest learns its TSC from the hypervisor, and "cpu MHz"
        // of a frequency-scaling host is no TSC frequency to impose on it.
        if let (Accel::Tcg, Some(khz)) = (self.accel, self.tsc_khz) {
            cmdline.push_str(&format!(" tsc_early_khz={khz}"));
        }
        cmdline
    }

    /// The root disk and environment of the image `name` (`host`, or a store image by name or
    /// digest); a store image's disk is built first if it has none.
    async fn root(&self, name: &str) -> Result<Root, RuntimeError> {
        if koder_image::is_host(name) {
            return Ok(Root {
                disk: self.image.rootfs.clone(),
                env: koder_image::host_env(),
                workdir: koder_image::DEFAULT_WORKDIR.into(),
            });
        }
        let Some(store) = self.cfg.images.clone() else {
            return Err(RuntimeError::InvalidSpec(format!(
                "unknown image {name:?}: this runtime has no image store"
            )));
        };
        let (lookup, owned) = (store.clone(), name.to_string());
        // Manifests and names are files: read off the async workers, as the disk is built.
        let found = blocking(move || koder_image::find(Some(&lookup), &owned)).await??;
        let (env, workdir) = (found.manifest.env.clone(), found.manifest.workdir.clone());
        let lock = self
            .disk_builds
            .lock()
            .entry(found.manifest.digest.clone())
            .or_default()
            .clone();
        let _building = lock.lock().await;
        let disk = blocking(move || disk::ensure(&store, &found))
            .await?
            .map_err(|e| RuntimeError::Start(format!("image {name:?}: {e}")))?;
        Ok(Root { disk, env, workdir })
    }

    /// Boots a VM on `root` into `host` (whose directory exists and is empty) and connects to
    /// its agent.
    async fn boot(
        &self,
        spec: &SandboxSpec,
        root: Root,
        host: &VmHost,
    ) -> Result<Started, RuntimeError> {
        let dir = &host.dir;
        let limits = merge(&spec.limits, &self.cfg.default_limits);
        let capacity_mib = limits.memory_mib.unwrap_or(0).max(self.cfg.vm_memory_mib);
        let vcpus = limits
            .cpu_millis
            .map_or(1, |m| m.div_ceil(1000))
            .clamp(1, host_cpus());
        let scratch = dir.join("scratch.ext4");
        let disk_mib = limits.disk_mib.unwrap_or(DEFAULT_DISK_MIB);
        self.scratch_disk(disk_mib, &scratch).await?;
        let (layers_disk, vm_layers) = self.layers_disk(spec, dir, disk_mib).await?.unzip();
        let initrd = dir.join("initrd.cpio");
        let serials = (
            self.vmm.disk_serial(&root.disk, VM_ROOT_DISK_SERIAL)?,
            self.vmm.disk_serial(&scratch, VM_SCRATCH_DISK_SERIAL)?,
        );
        let channel = self.vmm.agent_channel(dir, AGENT_VSOCK_PORT);
        let vm_cfg = self.vm_config(spec, &root, &limits, serials, vm_layers, &channel);
        initrd::write_for_vm(&self.initrd_base, &vm_cfg, &initrd)
            .map_err(|e| RuntimeError::Start(format!("guest initrd: {e}")))?;
        for path in [dir, &scratch, &initrd].into_iter().chain(&layers_disk) {
            std::os::unix::fs::chown(path, Some(host.uid), Some(host.uid))
                .map_err(RuntimeError::io(format!("chown {}", path.display())))?;
        }
        set_mode(dir, 0o700)?;
        let launch = Launch {
            dir: dir.clone(),
            id: spec.id.clone(),
            vmlinux: self.image.vmlinux.clone(),
            initrd,
            cmdline: self.cmdline(),
            root_disk: root.disk,
            scratch_disk: scratch,
            layers_disk,
            vcpus,
            memory_mib: capacity_mib + GUEST_OVERHEAD_MIB,
            channel,
            uid: host.uid,
            gid: self.vmm_gid(host.uid),
            accel: self.accel,
            shares: volume_shares(spec),
        };
        let record = VmRecord {
            rootfs: FileStamp::of(&launch.root_disk)?,
            launch,
            memory_capacity_mib: capacity_mib,
        };
        write_durably(&dir.join(RECORD_FILE), &record.encode()?)?;
        let _permit = self.permit().await?;
        self.start_vmm(host, &record.launch, |l| self.vmm.start(l))
            .await?;
        let agent = self.agent_of(&record.launch, host).await?;
        Ok(Started {
            agent,
            launch: record.launch,
            memory_capacity_mib: capacity_mib,
        })
    }

    async fn permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>, RuntimeError> {
        self.boot_permits
            .acquire()
            .await
            .map_err(|_| RuntimeError::Unavailable("the runtime is shutting down".into()))
    }

    /// Starts the VMM processes of `launch` with `start`, in a host cgroup of their own, all
    /// owned by `host` at once, so a failure from here on tears all of it down.
    async fn start_vmm<'a, F, Fut>(
        &self,
        host: &VmHost,
        launch: &'a Launch,
        start: F,
    ) -> Result<(), RuntimeError>
    where
        F: FnOnce(&'a Launch) -> Fut,
        Fut: std::future::Future<Output = Result<vmm::VmProcesses, RuntimeError>>,
    {
        *host.cgroup.lock() = self.host_cgroup(&launch.id, launch.memory_mib, launch.vcpus)?;
        let processes = start(launch).await?;
        let pids: Vec<u32> = processes.children.iter().filter_map(|c| c.id()).collect();
        host.children.lock().extend(processes.children);
        reap::record(&launch.dir.join(PIDS_FILE), &pids)?;
        if let Some(cg) = host.cgroup.lock().as_ref() {
            for pid in &pids {
                cg.add_process(*pid)
                    .map_err(|e| RuntimeError::Cgroup(e.to_string()))?;
            }
        }
        Ok(())
    }

    /// The guest agent of a started VM, with the end of its console when it does not answer.
    async fn agent_of(&self, launch: &Launch, host: &VmHost) -> Result<AgentClient, RuntimeError> {
        self.connect(launch, host).await.map_err(|e| {
            let console = console_tail(&launch.console_log());
            RuntimeError::Start(format!("{e}; console: {console}"))
        })
    }

    /// Starts the VM `suspend` saved in `host`'s directory, under `host`'s uid.
    async fn restore(&self, host: &VmHost, record: VmRecord) -> Result<Started, RuntimeError> {
        let vmm = self.vmm.memory_snapshots().ok_or_else(no_snapshots)?;
        if FileStamp::of(&record.launch.root_disk)? != record.rootfs {
            return Err(RuntimeError::Start(
                "the image's root disk changed since the VM was saved".into(),
            ));
        }
        let mut launch = record.launch;
        launch.uid = host.uid;
        launch.gid = self.vmm_gid(host.uid);
        chown_dir(&host.dir, host.uid)?;
        let snapshot = host.dir.join(SNAPSHOT_FILE);
        let state = std::fs::File::open(&snapshot)
            .map_err(RuntimeError::io(format!("open {}", snapshot.display())))?;
        let _permit = self.permit().await?;
        self.start_vmm(host, &launch, |l| vmm.start_paused(l))
            .await?;
        vmm.load(&launch, &state).await?;
        // From here on the guest's disks move on: the saved state can never be used again,
        // even if the daemon dies before the session says it runs.
        std::fs::remove_file(&snapshot).map_err(RuntimeError::io("remove the used state"))?;
        fsync_dir(&host.dir)?;
        vmm.cont(&launch).await?;
        let agent = self.agent_of(&launch, host).await?;
        Ok(Started {
            agent,
            launch,
            memory_capacity_mib: record.memory_capacity_mib,
        })
    }

    /// A fresh host side for the VM `id` (directory `dir`), on a uid slot of its own.
    fn host(&self, id: &str) -> Result<VmHost, RuntimeError> {
        let slot = self.slots.acquire()?;
        Ok(VmHost {
            dir: vms_dir(&self.cfg).join(id),
            uid: self.cfg.uid_base + slot,
            children: Mutex::default(),
            cgroup: Mutex::default(),
            slot: Mutex::new(Some(slot)),
            slots: self.slots.clone(),
            kept: AtomicBool::new(false),
        })
    }

    /// `host` running what `started` says, or torn down with the error.
    async fn finish(
        &self,
        host: VmHost,
        started: Result<Started, RuntimeError>,
    ) -> Result<Arc<dyn Sandbox>, RuntimeError> {
        match started {
            Ok(s) => Ok(Arc::new(MicroVm {
                id: s.launch.id.clone(),
                agent: s.agent,
                memory_capacity_mib: s.memory_capacity_mib,
                launch: s.launch,
                vmm: self.vmm.clone(),
                host,
            })),
            Err(e) => {
                let _ = host.teardown().await;
                Err(e)
            }
        }
    }

    /// Keeps or removes (with its processes) each VM directory a previous run left: kept are
    /// the complete suspended VMs `keep` names (all of them for `None`).
    async fn sweep(&self, keep: Option<&[String]>) -> Result<ReconcileReport, RuntimeError> {
        let mut report = ReconcileReport::default();
        // The cgroups first: destroying one kills whatever VMM still runs in it.
        if let Some(driver) = &self.cgroups {
            let names = driver
                .list()
                .map_err(|e| RuntimeError::Cgroup(e.to_string()))?;
            for name in names.iter().filter(|n| n.starts_with(&self.cgroup_prefix)) {
                if let Ok(cg) = driver.open(name) {
                    cg.destroy()
                        .map_err(|e| RuntimeError::Cgroup(e.to_string()))?;
                }
            }
        }
        let Ok(entries) = std::fs::read_dir(vms_dir(&self.cfg)) else {
            return Ok(report);
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            let id = entry.file_name().to_string_lossy().into_owned();
            reap::kill_recorded(&dir.join(PIDS_FILE), &vmm_executables()).await;
            let wanted = keep.is_none_or(|k| k.contains(&id));
            if wanted && is_suspended(&dir) {
                // What a run of it left beside the saved state (a crash mid-resume cannot
                // have: the state is removed before the guest runs).
                for leftover in [PIDS_FILE, SNAPSHOT_PARTIAL] {
                    let _ = std::fs::remove_file(dir.join(leftover));
                }
                report.suspended_kept.push(id);
                continue;
            }
            std::fs::remove_dir_all(&dir)
                .map_err(RuntimeError::io(format!("remove {}", dir.display())))?;
            report.sandboxes_removed.push(id);
        }
        Ok(report)
    }

    /// The host cgroup of a VM's VMM processes: guest memory plus what QEMU itself needs (its
    /// mappings, heap, TCG translation cache), the vCPUs plus half a core for its I/O threads.
    fn host_cgroup(
        &self,
        id: &str,
        guest_mib: u64,
        vcpus: u32,
    ) -> Result<Option<Box<dyn Cgroup>>, RuntimeError> {
        let Some(driver) = &self.cgroups else {
            return Ok(None);
        };
        let cg_err = |e: koder_cgroups::CgroupError| RuntimeError::Cgroup(e.to_string());
        let cg = driver
            .create(&format!("{}{id}", self.cgroup_prefix))
            .map_err(cg_err)?;
        let limits = koder_cgroups::Limits {
            memory_max_bytes: Some((guest_mib + VMM_OVERHEAD_MIB) << 20),
            cpu: Some(koder_cgroups::CpuQuota::from_millis(
                u64::from(vcpus) * 1000 + 500,
            )),
            pids_max: Some(VMM_PIDS),
        };
        if let Err(e) = cg.set_limits(&limits) {
            let _ = cg.destroy();
            return Err(cg_err(e));
        }
        Ok(Some(cg))
    }

    /// With KVM the VMM must open /dev/kvm, usually `root:kvm 0660`: its group is the VMM's.
    fn vmm_gid(&self, uid: u32) -> u32 {
        use std::os::unix::fs::MetadataExt;
        match self.accel {
            Accel::Kvm => std::fs::metadata("/dev/kvm").map_or(uid, |m| m.gid()),
            Accel::Tcg => uid,
        }
    }

    /// Waits for the guest agent: connects until it answers a health check, the VMM dies or
    /// the boot deadline passes.
    ///
    /// The first connection waits for the agent's line on the console (a vsock connection made
    /// before the guest's driver is up is lost; a resumed guest has the line already), and
    /// every attempt is bounded, so nothing here can hang past the deadline.
    async fn connect(&self, launch: &Launch, vm: &VmHost) -> Result<AgentClient, RuntimeError> {
        let deadline = Instant::now() + self.cfg.boot_timeout;
        let console = launch.console_log();
        loop {
            if let Some(exited) = vm.exited_child() {
                return Err(RuntimeError::Start(format!(
                    "the VM stopped while booting ({exited})"
                )));
            }
            if agent_announced(&console) {
                let attempt = async {
                    let (r, w) = open_channel(&launch.channel).await.ok()?;
                    let agent = AgentClient::new(r, w);
                    agent.health().await.ok().map(|_| agent)
                };
                if let Ok(Some(agent)) = tokio::time::timeout(CONNECT_ATTEMPT, attempt).await {
                    return Ok(agent);
                }
            }
            if Instant::now() > deadline {
                return Err(RuntimeError::Start(format!(
                    "the guest agent did not answer within {:?}",
                    self.cfg.boot_timeout
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn vm_config(
        &self,
        spec: &SandboxSpec,
        root: &Root,
        limits: &Limits,
        serials: (String, String),
        layers: Option<VmLayers>,
        channel: &AgentChannel,
    ) -> VmConfig {
        let mut env = root.env.clone();
        for (k, v) in &spec.env {
            env.retain(|(key, _)| key != k);
            env.push((k.clone(), v.clone()));
        }
        VmConfig {
            hostname: "sandbox".into(),
            workdir: root.workdir.clone(),
            env,
            // Landlock would otherwise leave a writable volume, or an image's working
            // directory elsewhere, read-only.
            writable_dirs: koder_image::writable_dirs(&spec.image, &root.workdir)
                .into_iter()
                .chain(
                    spec.volumes
                        .iter()
                        .filter(|v| !v.read_only)
                        .map(|v| v.target.clone()),
                )
                .collect(),
            rlimits: Rlimits {
                nofile: 4096,
                nproc: limits.pids.unwrap_or(256).max(64) * 4,
                core: 0,
            },
            tmp_size_mib: self.cfg.tmp_size_mib,
            vsock_port: AGENT_VSOCK_PORT,
            serial_port: match channel {
                AgentChannel::Serial { name, .. } => Some(name.clone()),
                AgentChannel::Vsock { .. } => None,
            },
            limits: guest_limits(limits),
            root_disk_serial: serials.0,
            scratch_disk_serial: serials.1,
            egress: spec.egress,
            layers,
            volumes: spec
                .volumes
                .iter()
                .enumerate()
                .map(|(n, v)| VmVolume {
                    tag: virtiofs::tag(n),
                    target: v.target.clone(),
                    read_only: v.read_only,
                })
                .collect(),
        }
    }
}

/// KVM as the VMM processes will find it: they run as an unprivileged uid in `/dev/kvm`'s
/// group, so a device only root may open leaves them TCG.
fn vmm_accel(host: (Accel, Option<String>)) -> (Accel, Option<String>) {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata("/dev/kvm").map_or(0, |m| m.permissions().mode());
    accel_for_device_mode(host, mode)
}

fn accel_for_device_mode(
    (accel, why): (Accel, Option<String>),
    mode: u32,
) -> (Accel, Option<String>) {
    if accel != Accel::Kvm {
        return (accel, why);
    }
    if mode & 0o060 == 0o060 || mode & 0o006 == 0o006 {
        (Accel::Kvm, None)
    } else {
        (
            Accel::Tcg,
            Some(format!(
                "/dev/kvm (mode {:o}) is not open to its group, which VMM processes run in",
                mode & 0o777
            )),
        )
    }
}

/// The cgroup driver for VMM processes, saying in `enforcement` whether there is one.
fn host_cgroups(
    cfg: &MicroVmConfig,
    enforcement: &mut Enforcement,
) -> Option<Box<dyn CgroupDriver>> {
    let parent = cfg.cgroup_parent.as_deref()?;
    let why = if !rustix::process::geteuid().is_root() {
        "the daemon is not root".to_string()
    } else {
        match koder_cgroups::detect(parent) {
            Ok(driver) => {
                enforcement.enforced.push(format!(
                    "host cgroup {:?} per VM: memory, cpu and pids of its VMM processes",
                    driver.version()
                ));
                return Some(Box::new(driver));
            }
            Err(e) => e.to_string(),
        }
    };
    enforcement.not_enforced.push(NotEnforced {
        what: "host cgroup limits of VMM processes".into(),
        why,
    });
    None
}

/// The backend: Firecracker (KVM only) where asked or, for `auto`, where it and usable KVM
/// exist; QEMU otherwise. `no_kvm` says why KVM is not usable, if it is not.
fn select_vmm(cfg: &MicroVmConfig, no_kvm: Option<&str>) -> Result<Arc<dyn Vmm>, RuntimeError> {
    let qemu = || -> Result<Arc<dyn Vmm>, RuntimeError> {
        Ok(Arc::new(qemu::Qemu::new(cfg.qemu_bin.clone())?))
    };
    let firecracker = || -> Result<Arc<dyn Vmm>, RuntimeError> {
        if let Some(why) = no_kvm {
            return Err(RuntimeError::Unavailable(format!(
                "firecracker needs hardware KVM: {why}"
            )));
        }
        Ok(Arc::new(firecracker::Firecracker::new(
            cfg.firecracker_bin.clone(),
        )?))
    };
    match cfg.backend {
        Backend::Qemu => qemu(),
        Backend::Firecracker => firecracker(),
        Backend::Auto => firecracker().or_else(|_| qemu()),
    }
}

#[async_trait]
impl Runtime for MicroVmRuntime {
    fn name(&self) -> &'static str {
        "microvm"
    }

    fn enforcement(&self) -> &Enforcement {
        &self.enforcement
    }

    fn is_full(&self) -> bool {
        self.slots.all_used()
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Arc<dyn Sandbox>, RuntimeError> {
        validate_id(&spec.id)?;
        refuse_volumes(&spec, self.vmm.as_ref())?;
        // Before a slot is taken: the first VM on an image may wait for its disk's build.
        let root = self.root(&spec.image).await?;
        let host = self.host(&spec.id)?;
        let _ = std::fs::remove_dir_all(&host.dir);
        let started = match std::fs::create_dir(&host.dir) {
            Ok(()) => self.boot(&spec, root, &host).await,
            Err(e) => Err(RuntimeError::io(format!("create {}", host.dir.display()))(
                e,
            )),
        };
        self.finish(host, started).await
    }

    async fn reconcile(&self) -> Result<ReconcileReport, RuntimeError> {
        self.sweep(None).await
    }

    async fn reconcile_keeping(&self, keep: &[String]) -> Result<ReconcileReport, RuntimeError> {
        self.sweep(Some(keep)).await
    }

    async fn resume_suspended(&self, id: &str) -> Result<Arc<dyn Sandbox>, RuntimeError> {
        validate_id(id)?;
        let dir = vms_dir(&self.cfg).join(id);
        if !is_suspended(&dir) {
            let _ = remove_dir(&dir);
            return Err(RuntimeError::Start(format!("VM {id} has no saved state")));
        }
        let record = std::fs::read(dir.join(RECORD_FILE))
            .map_err(RuntimeError::io("read the VM's record"))
            .and_then(|raw| VmRecord::decode(&raw));
        // Exhausted: nothing touched, the state stays for a later try.
        let host = self.host(id)?;
        let started = match record {
            Ok(record) => self.restore(&host, record).await,
            Err(e) => Err(e),
        };
        let resumed = self.finish(host, started).await;
        if let Err(e) = &resumed {
            tracing::warn!(vm = %id, error = %e, "resuming a saved VM failed; its state is gone");
        }
        resumed
    }

    async fn discard_suspended(&self, id: &str) -> Result<(), RuntimeError> {
        validate_id(id)?;
        remove_dir(&vms_dir(&self.cfg).join(id))
    }
}

pub struct MicroVm {
    id: String,
    agent: AgentClient,
    host: VmHost,
    /// Guest memory available to the sandbox: the most its memory limit can be.
    memory_capacity_mib: u64,
    /// How it was started: a suspended VM comes back on exactly this machine.
    launch: Launch,
    vmm: Arc<dyn Vmm>,
}

/// A VM whose agent answered.
struct Started {
    agent: AgentClient,
    launch: Launch,
    memory_capacity_mib: u64,
}

/// What a VM's directory records about it ([`RECORD_FILE`]), for a resume in a later run.
#[derive(Debug, Serialize, Deserialize)]
struct VmRecord {
    launch: Launch,
    memory_capacity_mib: u64,
    /// The image's root disk as the guest last saw it: a guest resumed over another disk
    /// would read blocks its page cache does not match.
    rootfs: FileStamp,
}

impl VmRecord {
    fn encode(&self) -> Result<Vec<u8>, RuntimeError> {
        serde_json::to_vec(self)
            .map_err(|e| RuntimeError::Start(format!("encode the VM's record: {e}")))
    }

    fn decode(raw: &[u8]) -> Result<Self, RuntimeError> {
        serde_json::from_slice(raw)
            .map_err(|e| RuntimeError::Start(format!("the VM's record: {e}")))
    }
}

/// Size and modification time of a file.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct FileStamp {
    len: u64,
    mtime_ns: i128,
}

impl FileStamp {
    fn of(path: &Path) -> Result<Self, RuntimeError> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)
            .map_err(RuntimeError::io(format!("stat {}", path.display())))?;
        Ok(Self {
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }
}

/// The VM's launch record, its saved state and the state while it is written.
const RECORD_FILE: &str = "vm.json";
const SNAPSHOT_FILE: &str = "memory.snap";
const SNAPSHOT_PARTIAL: &str = "memory.partial";

/// A directory holding a complete saved VM: its state file exists only once complete.
fn is_suspended(dir: &Path) -> bool {
    dir.join(SNAPSHOT_FILE).is_file() && dir.join(RECORD_FILE).is_file()
}

fn no_snapshots() -> RuntimeError {
    RuntimeError::Unavailable("this VMM cannot save VMs to files".into())
}

/// Writes `bytes` to `path` so that a crash leaves the old file or the new one, never a part.
fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), RuntimeError> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let io = |what: &str| RuntimeError::io(format!("{what} {}", tmp.display()));
    let mut f = std::fs::File::create(&tmp).map_err(io("create"))?;
    f.write_all(bytes).map_err(io("write"))?;
    f.sync_all().map_err(io("fsync"))?;
    std::fs::rename(&tmp, path).map_err(io("rename"))?;
    fsync_dir(path.parent().unwrap_or(Path::new("/")))
}

fn fsync_dir(dir: &Path) -> Result<(), RuntimeError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(RuntimeError::io(format!("fsync {}", dir.display())))
}

/// Gives `dir` and the files in it to `uid` (a resumed VM runs under a uid of its own).
fn chown_dir(dir: &Path, uid: u32) -> Result<(), RuntimeError> {
    let chown = |p: &Path| {
        std::os::unix::fs::lchown(p, Some(uid), Some(uid))
            .map_err(RuntimeError::io(format!("chown {}", p.display())))
    };
    chown(dir)?;
    for entry in std::fs::read_dir(dir).map_err(RuntimeError::io("list the VM's files"))? {
        let entry = entry.map_err(RuntimeError::io("list the VM's files"))?;
        chown(&entry.path())?;
    }
    Ok(())
}

/// A byte stream to the guest agent, reached the way its VMM offers.
async fn open_channel(
    channel: &AgentChannel,
) -> std::io::Result<(
    Box<dyn AsyncRead + Send + Unpin>,
    Box<dyn AsyncWrite + Send + Unpin>,
)> {
    Ok(match channel {
        AgentChannel::Vsock { uds, port } => {
            let (r, w) = vsock::connect(uds, *port).await?.into_split();
            (Box::new(r), Box::new(w))
        }
        AgentChannel::Serial { socket, .. } => {
            let (r, w) = serial::connect(socket).await?;
            (Box::new(r), Box::new(w))
        }
    })
}

/// The host side of one VM: its directory, VMM processes and uid slot.
struct VmHost {
    dir: PathBuf,
    uid: u32,
    children: Mutex<Vec<Child>>,
    /// The host cgroup of the VMM processes, once they run.
    cgroup: Mutex<Option<Box<dyn Cgroup>>>,
    slot: Mutex<Option<u32>>,
    slots: Slots,
    /// Saved to a file: the directory outlives this handle.
    kept: AtomicBool,
}

impl VmHost {
    fn exited_child(&self) -> Option<String> {
        let mut children = self.children.lock();
        children
            .iter_mut()
            .find_map(|c| c.try_wait().ok().flatten().map(|s| s.to_string()))
    }

    /// Kills the VMM processes, removes the directory (unless the VM was saved to a file) and
    /// frees the uid; idempotent.
    async fn teardown(&self) -> Result<(), RuntimeError> {
        let mut result = self.stop_processes().await;
        if !self.kept.load(Ordering::SeqCst) {
            result = remove_dir(&self.dir).and(result);
        }
        // The uid is free only once nothing runs as it and its files are gone.
        if let Some(slot) = self.slot.lock().take() {
            self.slots.release(slot);
        }
        result
    }

    /// Kills the VMM processes and removes their cgroup and pid record.
    async fn stop_processes(&self) -> Result<(), RuntimeError> {
        let children = std::mem::take(&mut *self.children.lock());
        kill_all(children).await;
        let _ = std::fs::remove_file(self.dir.join(PIDS_FILE));
        match self.cgroup.lock().take() {
            Some(cg) => cg
                .destroy()
                .map_err(|e| RuntimeError::Teardown(format!("VMM cgroup: {e}"))),
            None => Ok(()),
        }
    }

    /// After the VM was saved: its processes end, its uid goes back, its files stay.
    async fn release_kept(&self) -> Result<(), RuntimeError> {
        self.kept.store(true, Ordering::SeqCst);
        self.teardown().await
    }
}

/// A VM dropped without `destroy` (a panic, a dropped future): its VMM processes die with their
/// `Child` handles (`kill_on_drop`) and its cgroup; the directory and the uid are released.
impl Drop for VmHost {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.lock().take() {
            let _ = std::fs::remove_dir_all(&self.dir);
            if let Some(cg) = self.cgroup.lock().take() {
                let _ = cg.destroy();
            }
            self.slots.release(slot);
        }
    }
}

/// Volumes are file shares (virtio-fs); a backend without them refuses volumes before
/// anything boots.
fn refuse_volumes(spec: &SandboxSpec, vmm: &dyn Vmm) -> Result<(), RuntimeError> {
    if spec.volumes.is_empty() {
        Ok(())
    } else {
        vmm.file_shares()
    }
}

/// The shares of a VM's volumes, in the order of `spec.volumes` (share `n` has tag
/// [`virtiofs::tag`]`(n)`).
fn volume_shares(spec: &SandboxSpec) -> Vec<vmm::Share> {
    spec.volumes
        .iter()
        .enumerate()
        .map(|(n, v)| vmm::Share {
            source: v.source.clone(),
            tag: virtiofs::tag(n),
            read_only: v.read_only,
        })
        .collect()
}

async fn kill_all(children: Vec<Child>) {
    for mut child in children {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

fn remove_dir(dir: &Path) -> Result<(), RuntimeError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RuntimeError::Teardown(format!(
            "remove {}: {e}",
            dir.display()
        ))),
    }
}

#[async_trait]
impl Sandbox for MicroVm {
    fn id(&self) -> &str {
        &self.id
    }

    fn agent(&self) -> &AgentClient {
        &self.agent
    }

    async fn destroy(&self) -> Result<(), RuntimeError> {
        self.host.teardown().await
    }

    fn resources(&self) -> Option<&dyn ResourceControl> {
        Some(self)
    }

    /// None with volumes: a vhost-user device does not migrate (virtiofsd's state of the
    /// guest's open files lives outside QEMU), so such a VM pauses without its memory.
    fn memory_snapshot(&self) -> Option<&dyn MemorySnapshot> {
        if !self.launch.shares.is_empty() {
            return None;
        }
        self.vmm
            .memory_snapshots()
            .map(|_| self as &dyn MemorySnapshot)
    }
}

#[async_trait]
impl MemorySnapshot for MicroVm {
    async fn suspend(&self) -> Result<(), RuntimeError> {
        let vmm = self.vmm.memory_snapshots().ok_or_else(no_snapshots)?;
        let started = Instant::now();
        let dir = &self.host.dir;
        let partial = dir.join(SNAPSHOT_PARTIAL);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&partial)
            .map_err(RuntimeError::io(format!("create {}", partial.display())))?;
        if let Err(e) = vmm.save(&self.launch, &file).await {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
        koder_hostkit::crash::point("vm-suspend-before-commit");
        // The VM is stopped and its state written: its processes can go (QEMU drained the
        // disks' requests when it stopped the VM).
        self.host.stop_processes().await?;
        let (scratch, dir_owned) = (self.launch.scratch_disk.clone(), dir.clone());
        let bytes = tokio::task::spawn_blocking(move || commit(file, &scratch, &dir_owned))
            .await
            .map_err(|e| RuntimeError::Start(format!("commit task: {e}")))??;
        self.host.release_kept().await?;
        tracing::info!(vm = %self.id, bytes, took = ?started.elapsed(), "VM saved to a file");
        Ok(())
    }
}

/// Makes a written state durable and complete: the state and the scratch disk on disk, then
/// the state renamed to the name that says it is complete. Returns its size.
fn commit(state: std::fs::File, scratch: &Path, dir: &Path) -> Result<u64, RuntimeError> {
    state
        .sync_all()
        .map_err(RuntimeError::io("fsync the VM state"))?;
    std::fs::File::open(scratch)
        .and_then(|f| f.sync_all())
        .map_err(RuntimeError::io("fsync the scratch disk"))?;
    let bytes = state.metadata().map_or(0, |m| m.len());
    std::fs::rename(dir.join(SNAPSHOT_PARTIAL), dir.join(SNAPSHOT_FILE))
        .map_err(RuntimeError::io("commit the VM state"))?;
    fsync_dir(dir)?;
    Ok(bytes)
}

#[async_trait]
impl ResourceControl for MicroVm {
    async fn usage(&self) -> Result<Usage, RuntimeError> {
        Ok(self.agent.guest_usage().await?)
    }

    async fn set_limits(&self, limits: &Limits) -> Result<(), RuntimeError> {
        if let Some(mib) = limits.memory_mib.filter(|m| *m > self.memory_capacity_mib) {
            return Err(RuntimeError::InvalidSpec(format!(
                "memory limit {mib} MiB exceeds this VM's {} MiB",
                self.memory_capacity_mib
            )));
        }
        Ok(self.agent.guest_limits(guest_limits(limits)).await?)
    }

    async fn reset_memory_peak(&self) -> Result<(), RuntimeError> {
        // cgroup v2 learned to reset memory.peak in Linux 6.12; the guest kernel is older.
        Err(RuntimeError::Cgroup(
            "the guest kernel cannot reset its memory peak".into(),
        ))
    }

    async fn freeze(&self) -> Result<(), RuntimeError> {
        Ok(self.agent.guest_freeze(true).await?)
    }

    async fn thaw(&self) -> Result<(), RuntimeError> {
        Ok(self.agent.guest_freeze(false).await?)
    }
}

fn guest_limits(limits: &Limits) -> GuestLimits {
    GuestLimits {
        memory_bytes: limits.memory_mib.map(|m| m.saturating_mul(1 << 20)),
        pids: limits.pids,
        cpu_millis: limits.cpu_millis,
    }
}

fn merge(spec: &Limits, defaults: &Limits) -> Limits {
    Limits {
        cpu_millis: spec.cpu_millis.or(defaults.cpu_millis),
        memory_mib: spec.memory_mib.or(defaults.memory_mib),
        pids: spec.pids.or(defaults.pids),
        disk_mib: spec.disk_mib.or(defaults.disk_mib),
    }
}

/// `f` on a blocking thread (file system work that must not hold up an async worker).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, RuntimeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RuntimeError::Start(format!("blocking task: {e}")))
}

fn vms_dir(cfg: &MicroVmConfig) -> PathBuf {
    cfg.state_dir.join("vms")
}

fn host_cpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// The host's TSC frequency from /proc/cpuinfo ("cpu MHz"), in kHz.
fn host_tsc_khz() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 = info
        .lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()?;
    Some((mhz * 1000.0).round() as u64)
}

/// The agent binary to pack as the guest's init: a stripped copy when `strip` is available
/// (debug builds carry tens of MiB of symbols that would sit in guest memory for nothing).
fn guest_agent(agent: &Path, state_dir: &Path) -> Result<PathBuf, RuntimeError> {
    if !agent.is_file() {
        return Err(RuntimeError::Unavailable(format!(
            "agent binary {} not found",
            agent.display()
        )));
    }
    let copy = state_dir.join("koder-agent.guest");
    std::fs::copy(agent, &copy).map_err(RuntimeError::io("copy the agent"))?;
    let stripped = std::process::Command::new("strip")
        .arg("--strip-debug")
        .arg(&copy)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        tracing::info!("strip unavailable; the guest initrd carries the agent's debug info");
    }
    Ok(copy)
}

/// The VMM processes of a VM, recorded so a later daemon can kill them after a crash.
const PIDS_FILE: &str = "vmm.pids";

/// What a recorded VMM pid must still be running to be killed: their paths are configurable,
/// their names are not.
fn vmm_executables() -> ExeMatch {
    ExeMatch::NamePrefix(
        ["qemu-system-x86_64", "firecracker", "virtiofsd"]
            .map(String::from)
            .to_vec(),
    )
}

/// The end of the guest console log (at most [`CONSOLE_TAIL_BYTES`]): only the kernel and the
/// agent write there (sandbox code has no console device), and only the end is ever needed.
fn console_end(console: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(console) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(CONSOLE_TAIL_BYTES)));
    let mut tail = Vec::new();
    let _ = f.take(CONSOLE_TAIL_BYTES).read_to_end(&mut tail);
    String::from_utf8_lossy(&tail).into_owned()
}

/// Whether the guest agent said on the console that it listens.
fn agent_announced(console: &Path) -> bool {
    console_end(console).contains(VM_READY_LINE)
}

/// The last lines of the guest console, for boot failure reports, after the agent's own last
/// line: a failed boot ends in the kernel's panic (init exited), whose trace fills the tail.
fn console_tail(console: &Path) -> String {
    let text = console_end(console);
    let mut lines: Vec<&str> = text.lines().rev().take(8).collect();
    if let Some(agent) = text
        .lines()
        .rev()
        .skip(lines.len())
        .find(|l| l.starts_with(AGENT_CONSOLE_PREFIX))
    {
        lines.push("...");
        lines.push(agent);
    }
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend with or without file shares, for what the runtime decides before booting.
    struct FakeVmm {
        shares: bool,
    }

    #[async_trait]
    impl Vmm for FakeVmm {
        fn name(&self) -> &'static str {
            "fake"
        }

        async fn start(&self, _launch: &Launch) -> Result<vmm::VmProcesses, RuntimeError> {
            Err(RuntimeError::Start("not in unit tests".into()))
        }

        fn agent_channel(&self, dir: &Path, port: u32) -> AgentChannel {
            AgentChannel::Vsock {
                uds: dir.join("v.sock"),
                port,
            }
        }

        fn file_shares(&self) -> Result<(), RuntimeError> {
            if self.shares {
                Ok(())
            } else {
                Err(RuntimeError::Unsupported("no virtio-fs here".into()))
            }
        }
    }

    #[test]
    fn volumes_need_file_shares() {
        let (with, without) = (FakeVmm { shares: true }, FakeVmm { shares: false });
        let mut spec = SandboxSpec::default();
        assert!(refuse_volumes(&spec, &without).is_ok());
        for (target, read_only) in [("/data", false), ("/ref", true)] {
            spec.volumes.push(koder_runtime::VolumeMount {
                source: format!("/srv/volumes{target}").into(),
                target: target.into(),
                read_only,
            });
        }
        let err = refuse_volumes(&spec, &without).expect_err("volumes without shares");
        assert!(
            matches!(&err, RuntimeError::Unsupported(m) if m.contains("virtio-fs")),
            "{err}"
        );
        assert!(refuse_volumes(&spec, &with).is_ok());
        let shares = volume_shares(&spec);
        assert_eq!(shares.len(), 2);
        assert_eq!(shares[1].source, Path::new("/srv/volumes/ref"));
        assert_eq!(shares[1].tag, virtiofs::tag(1));
        assert!(shares[1].read_only && !shares[0].read_only);
    }

    #[test]
    fn limits_map_to_the_guest() {
        let g = guest_limits(&Limits {
            cpu_millis: Some(500),
            memory_mib: Some(64),
            pids: Some(10),
            disk_mib: Some(100),
        });
        assert_eq!(g.memory_bytes, Some(64 << 20));
        assert_eq!(g.cpu_millis, Some(500));
        assert_eq!(g.pids, Some(10));
        assert_eq!(guest_limits(&Limits::default()), GuestLimits::default());
    }

    #[test]
    fn kvm_only_where_the_vmm_uid_can_open_it() {
        let kvm = (Accel::Kvm, None);
        assert_eq!(accel_for_device_mode(kvm.clone(), 0o20660).0, Accel::Kvm);
        assert_eq!(accel_for_device_mode(kvm.clone(), 0o20666).0, Accel::Kvm);
        let (accel, why) = accel_for_device_mode(kvm, 0o20600);
        assert_eq!(accel, Accel::Tcg);
        assert!(why.unwrap().contains("600"));
        let tcg = (Accel::Tcg, Some("pvm".to_string()));
        assert_eq!(accel_for_device_mode(tcg.clone(), 0o20666), tcg);
    }

    #[test]
    fn tsc_frequency_is_read() {
        // Every x86 Linux host reports a clock in /proc/cpuinfo.
        assert!(host_tsc_khz().is_some_and(|k| k > 100_000));
    }

    #[test]
    fn console_tail_keeps_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.log");
        let text: String = (0..20).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&p, text).unwrap();
        assert_eq!(console_tail(&p).split(" | ").count(), 8);
        assert!(console_tail(&p).ends_with("line 19"));
        assert_eq!(console_tail(&dir.path().join("none")), "");
        let boot: String = std::iter::once("koder-agent: setup failed at x\n".to_string())
            .chain((0..20).map(|i| format!("[ 2.5] trace {i}\n")))
            .collect();
        std::fs::write(&p, boot).unwrap();
        let tail = console_tail(&p);
        assert!(
            tail.starts_with("koder-agent: setup failed at x | ... | [ 2.5] trace 12"),
            "{tail}"
        );
        assert!(tail.ends_with("trace 19"), "{tail}");
    }
}
