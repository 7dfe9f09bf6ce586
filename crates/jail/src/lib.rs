//! The jail runtime: each sandbox is the koder agent as PID 1 of new user, mount, pid, net, ipc
//! and uts namespaces (plus its own cgroup namespace), on an overlay root, behind seccomp and
//! Landlock, with its uids mapped onto an unprivileged host range of its own.
//!
//! Host-side state per sandbox: a directory `<state>/sandboxes/<id>` (writable layer), a socket
//! `<state>/run/<id>.sock` (the agent channel; the sandbox cannot see it), and a cgroup
//! `<parent>/<id>` (the session's limits plus the agent's headroom) with two leaves: `agent`
//! (the agent alone) and `workload` (every sandbox process, under the session's limits), so an
//! OOM kill in the workload never takes the agent. All mounts live in the sandbox's mount
//! namespace and vanish with it; the host holds a sandbox's disk and volumes only from their
//! creation until the agent is cloned ([`disk`], `volumes`).

pub mod disk;
mod layers;

mod netns;
mod ready_cgroups;
mod spawn;
mod stock;
mod sudo_layer;
mod upper;
mod volumes;

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use koder_agent_protocol::init::{InitConfig, InitVolume, Rlimits};
use koder_agent_protocol::AgentClient;
use koder_cgroups::{Cgroup, CgroupDriver, CgroupVersion, CpuQuota};
use koder_hostkit::install::install_executable;
use koder_hostkit::mode::{check_traversable, set_mode};
use koder_hostkit::reap::{self, ExeMatch};
use koder_runtime::{
    validate_id, CopiedLayer, DiskClone, Enforcement, LayerBounds, Limits, NotEnforced,
    ReconcileReport, ResourceControl, Runtime, RuntimeError, Sandbox, SandboxSpec, Usage,
};

use koder_image as image;
pub use koder_image::{default_env, Image, WRITABLE_DIRS};
use koder_runtime::slots::Slots;
pub use layers::MAX_LOWER_LAYERS;
pub use spawn::IdMap;

pub use koder_runtime::SANDBOX_IDS;
/// The agent's host pid, in its sandbox directory, for reconciliation after a crash.
const AGENT_PID_FILE: &str = "agent.pid";
/// RLIMIT_NPROC of sandbox processes.
const NPROC_BACKSTOP: u64 = 8192;

/// What the sandbox's top cgroup allows beyond the session's limits, for the agent: its leaf
/// sits beside the workload's, so the workload hits its own limits first.
const AGENT_MEMORY_HEADROOM: u64 = 64 * 1024 * 1024;
const AGENT_PIDS_HEADROOM: u64 = 32;
/// The task the agent's spawner thread takes in a v1 workload (it lives there to clone every
/// exec's process in place), added to the workload's pids limit so the session keeps its own.
const SPAWNER_PIDS: u64 = 1;
/// Leaves of a sandbox's cgroup. Both are leaves on v1 too: one layout on both versions, and
/// v2 forbids processes in a group whose controllers are delegated to children.
const AGENT_CGROUP: &str = "agent";
const WORKLOAD_CGROUP: &str = "workload";

/// The unprivileged uid the sandbox's `user` account (1000) maps from.
pub const SANDBOX_USER_UID: u32 = 1000;

#[derive(Debug, Clone)]
pub struct JailConfig {
    /// Host directory for images, writable layers and agent sockets.
    pub state_dir: PathBuf,
    /// The `koder-agent` binary.
    pub agent_bin: PathBuf,
    /// First host uid/gid of sandbox ranges; sandbox `n` gets `uid_base + n * 65536`.
    pub uid_base: u32,
    pub max_sandboxes: u32,
    /// Cgroup directory (under each controller root) that holds one cgroup per sandbox.
    pub cgroup_parent: String,
    pub default_limits: Limits,
    pub tmp_size_mib: u64,
    /// How long a sandbox may take from clone to a healthy agent.
    pub start_timeout: Duration,
    /// Where images other than `host` come from (a spec names one by name or digest).
    pub images: Option<image::ImageStore>,
}

impl JailConfig {
    pub fn new(state_dir: impl Into<PathBuf>, agent_bin: impl Into<PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into(),
            agent_bin: agent_bin.into(),
            uid_base: 200_000,
            // 2000 idle sessions fit in well under 24 GB; the ranges end at 268 M host ids.
            max_sandboxes: 4096,
            cgroup_parent: "koder-sandbox".into(),
            default_limits: Limits {
                cpu_millis: Some(1000),
                memory_mib: Some(512),
                pids: Some(256),
                disk_mib: None,
            },
            tmp_size_mib: 256,
            start_timeout: Duration::from_secs(10),
            images: None,
        }
    }
}

pub struct JailRuntime {
    /// Shared with the blocking tasks that set sandboxes up.
    inner: Arc<Inner>,
}

struct Inner {
    cfg: JailConfig,
    /// Prefix of this runtime's cgroup names, derived from its state dir, so that several
    /// daemons (or test runs) sharing a cgroup parent never reconcile each other's sandboxes.
    cgroup_prefix: String,
    rootless: bool,
    cgroups: Option<Box<dyn CgroupDriver>>,
    /// Sandbox cgroups made ahead, where groups can be renamed (v1).
    ready_cgroups: Option<Arc<ready_cgroups::ReadyCgroups>>,
    /// Network namespaces made ahead (not rootless: only the host's root can make one the
    /// sandbox holds no capability over).
    ready_netns: Option<Arc<netns::ReadyNetns>>,
    image: Image,
    /// Size-limited writable layers, where the host can make them (root, loop devices, mkfs).
    disks: Option<Arc<disk::ReadyDisks>>,
    slots: Slots,
    /// Id mappings for idmapped volume and layer mounts, one per slot.
    user_namespaces: volumes::UserNamespaces,
    /// Captured layers unpacked as shared lower layers; `None` where mounts cannot be
    /// id-mapped (rootless), so layers are applied into each sandbox's upper layer.
    trees: Option<Arc<layers::Trees>>,
    /// Whether writable disks can be cloned block-sharing (reflink: the state dir is on
    /// btrfs or XFS), so a fork copies no file content.
    clones: bool,
    enforcement: Enforcement,
    /// The bottom layer of every sandbox's root: the agent as `sudo` ([`sudo_layer`]).
    sudo_layer: String,
}

impl JailRuntime {
    /// Prepares the state directory and the `host` image and works out what this host lets the
    /// jail enforce. Fails with `Unavailable` when the host cannot run jails at all.
    pub fn new(mut cfg: JailConfig) -> Result<Self, RuntimeError> {
        let rootless = !rustix::process::geteuid().is_root();
        for dir in [
            cfg.state_dir.clone(),
            sandboxes_dir(&cfg),
            run_dir(&cfg),
            cfg.state_dir.join("images"),
            cfg.state_dir.join("bin"),
            trash_dir(&cfg),
        ] {
            std::fs::create_dir_all(&dir)
                .map_err(RuntimeError::io(format!("create {}", dir.display())))?;
        }
        // Sandbox roots (host uids of their ranges) must traverse to their own layer dirs; the
        // socket dir stays private to the daemon.
        set_mode(&cfg.state_dir, 0o711)?;
        set_mode(&sandboxes_dir(&cfg), 0o711)?;
        set_mode(&run_dir(&cfg), 0o700)?;
        set_mode(&trash_dir(&cfg), 0o700)?;
        check_traversable(&cfg.state_dir)?;
        // Sandbox uids exec the agent, wherever it was built or installed (a build dir under
        // /root, say); agents still running keep the binary they started from.
        let bin_dir = cfg.state_dir.join("bin");
        cfg.agent_bin = install_executable(&cfg.agent_bin, &bin_dir, "koder-agent")?;
        set_mode(&bin_dir, 0o711)?;
        let sudo_layer = sudo_layer::install(&cfg.agent_bin, &cfg.state_dir)?;
        let image = image::host_image(&cfg.state_dir.join("images"))?;
        let mut enforcement = Enforcement {
            enforced: vec![
                "user, mount, pid, net, ipc, uts and cgroup namespaces".into(),
                "overlay root with read-only image".into(),
                "seccomp syscall filter".into(),
                "landlock filesystem rules".into(),
                "no_new_privs and reduced capability bounding set".into(),
            ],
            not_enforced: Vec::new(),
        };
        let cgroups = match koder_cgroups::detect(&cfg.cgroup_parent) {
            Ok(d) if !rootless => {
                enforcement.enforced.push(format!(
                    "cgroup {:?} limits: memory, cpu, pids",
                    d.version()
                ));
                Some(Box::new(d) as Box<dyn CgroupDriver>)
            }
            Ok(_) => {
                enforcement.not_enforced.push(NotEnforced {
                    what: "memory, cpu and pids limits".into(),
                    why: "running unprivileged: the cgroup hierarchy is not delegated to this user"
                        .into(),
                });
                None
            }
            Err(e) => {
                enforcement.not_enforced.push(NotEnforced {
                    what: "memory, cpu and pids limits".into(),
                    why: format!("no usable cgroup hierarchy: {e}"),
                });
                None
            }
        };
        let disks = if rootless {
            enforcement.not_enforced.push(NotEnforced {
                what: "disk quota".into(),
                why: "running unprivileged: loop devices need root".into(),
            });
            None
        } else if !Path::new("/dev/loop-control").exists()
            || !Path::new("/usr/sbin/mkfs.ext4").exists()
        {
            enforcement.not_enforced.push(NotEnforced {
                what: "disk quota".into(),
                why: "no /dev/loop-control or mkfs.ext4 (e2fsprogs) on this host".into(),
            });
            None
        } else {
            enforcement
                .enforced
                .push("disk quota (per-session ext4 on a loop device)".into());
            Some(disk::ReadyDisks::new(
                disk::DiskTemplates::overlay(cfg.state_dir.join("images/disks")),
                cfg.state_dir.join("disks-ready"),
            )?)
        };
        if rootless {
            enforcement.not_enforced.push(NotEnforced {
                what: "separate host uid range per sandbox".into(),
                why: "running unprivileged: only the daemon's own uid can be mapped".into(),
            });
        }
        for n in &enforcement.not_enforced {
            tracing::warn!(what = %n.what, why = %n.why, "jail runtime cannot enforce");
        }
        if !rootless {
            koder_runtime::slots::host_ids(cfg.uid_base, cfg.max_sandboxes, SANDBOX_IDS)?;
        }
        let trees = if rootless {
            None
        } else {
            Some(layers::Trees::new(
                cfg.state_dir.join("layers"),
                trash_dir(&cfg),
            )?)
        };
        let clones = disks.is_some() && trees.is_some() && disk::can_clone_in(&sandboxes_dir(&cfg));
        tracing::info!(
            clones,
            "forks {} writable disks",
            if clones { "clone" } else { "copy the files of" }
        );
        let cgroup_prefix = koder_cgroups::instance_prefix(&cfg.state_dir);
        // A driver of its own: the stock's refill thread holds the stock, not the runtime.
        let ready_cgroups = match &cgroups {
            Some(_) => koder_cgroups::detect(&cfg.cgroup_parent)
                .ok()
                .and_then(|d| {
                    ready_cgroups::ReadyCgroups::new(
                        Box::new(d),
                        &cgroup_prefix,
                        [AGENT_CGROUP, WORKLOAD_CGROUP],
                    )
                })
                .map(Arc::new),
            None => None,
        };
        let ready_netns = match rootless {
            true => None,
            false => netns::ReadyNetns::new().map(Arc::new),
        };
        let inner = Inner {
            clones,
            trees,
            cgroup_prefix,
            ready_cgroups,
            ready_netns,
            disks,
            slots: Slots::new(cfg.max_sandboxes),
            user_namespaces: volumes::UserNamespaces::default(),
            cfg,
            rootless,
            cgroups,
            image,
            enforcement,
            sudo_layer: sudo_layer.to_string_lossy().into_owned(),
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }
}

impl Inner {
    fn cgroup_name(&self, id: &str) -> String {
        format!("{}{id}", self.cgroup_prefix)
    }

    fn parts(&self, id: &str, cgroup: Option<Box<dyn Cgroup>>) -> Parts {
        Parts::new(
            sandboxes_dir(&self.cfg).join(id),
            run_dir(&self.cfg).join(format!("{id}.sock")),
            trash_dir(&self.cfg),
            cgroup,
        )
    }

    fn ids_for(&self, slot: u32) -> IdMap {
        if self.rootless {
            IdMap {
                host_base: rustix::process::geteuid().as_raw(),
                count: 1,
            }
        } else {
            IdMap {
                host_base: self.cfg.uid_base + slot * SANDBOX_IDS,
                count: SANDBOX_IDS,
            }
        }
    }

    /// Volumes need idmapped mounts, which only root can make; their targets follow the one
    /// rule the agent checks again.
    fn check_volumes(&self, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        if spec.volumes.is_empty() {
            return Ok(());
        }
        if self.rootless {
            return Err(RuntimeError::Unavailable(
                "volumes need a daemon running as root (idmapped mounts)".into(),
            ));
        }
        let targets: Vec<&str> = spec.volumes.iter().map(|v| v.target.as_str()).collect();
        koder_agent_protocol::check_mount_targets(&targets)
            .map_err(|e| RuntimeError::InvalidSpec(e.to_string()))
    }

    fn effective_limits(&self, requested: Limits) -> Limits {
        let d = self.cfg.default_limits;
        Limits {
            cpu_millis: requested.cpu_millis.or(d.cpu_millis),
            memory_mib: requested.memory_mib.or(d.memory_mib),
            pids: requested.pids.or(d.pids),
            disk_mib: requested.disk_mib.or(d.disk_mib),
        }
    }

    /// Creates the sandbox dir and its writable layer: on a disk of `disk_mib` (the quota) when
    /// the host can make one, else on the state dir's filesystem. Directories sandbox code may
    /// write to are pre-created in the upper layer, owned by the sandbox's root (or `user`),
    /// since the image's own copies belong to the host.
    ///
    /// A sandbox whose captured layers sit below its upper layer gets none of those
    /// (`!upper_dirs`): the layers hold them as the source sandbox had them (owners, modes),
    /// which the upper layer must not cover.
    ///
    /// A fork's copy starts from a clone of its source's disk (`clone`), which holds all of
    /// that.
    fn prepare_layers(
        &self,
        parts: &mut Parts,
        ids: IdMap,
        disk_mib: Option<u64>,
        upper_dirs: bool,
        clone: Option<&DiskClone>,
    ) -> Result<(), RuntimeError> {
        let io = |what: &str| RuntimeError::io(format!("prepare sandbox {what}"));
        let host_id = |in_sandbox: u32| (!self.rootless).then_some(ids.host_base + in_sandbox);
        let dir = parts.dir.clone();
        std::fs::create_dir(&dir).map_err(io("dir"))?;
        std::fs::create_dir(dir.join("root")).map_err(io("root"))?;
        match (disk_mib, &self.disks, clone) {
            (Some(mib), Some(_), Some(clone)) => {
                if clone.size_mib != mib {
                    return Err(RuntimeError::InvalidSpec(format!(
                        "the cloned disk is not of the sandbox's size ({mib} MiB)"
                    )));
                }
                // Its files are stored under the range of the sandbox the disk was made for.
                let remap = match clone.stored_ids_base == ids.host_base {
                    true => None,
                    false => Some(spawn::user_namespace(clone.stored_ids_base, ids)?),
                };
                let disk = disk::Disk::from_clone(clone, &dir, remap.as_ref().map(AsFd::as_fd))?;
                parts.upper = disk.upper.clone();
                parts.work = disk.work.clone();
                parts.disk = Some(disk);
            }
            (_, _, Some(_)) => {
                return Err(RuntimeError::InvalidSpec(
                    "a cloned disk needs a sandbox with a disk quota".into(),
                ));
            }
            (Some(mib), Some(disks), None) => {
                let owner = host_id(0).map(|id| (id, id));
                let disk = disk::Disk::create_ready(disks, &dir, mib, owner)?;
                parts.upper = disk.upper.clone();
                parts.work = disk.work.clone();
                parts.disk = Some(disk);
            }
            _ => {
                for sub in [&parts.upper, &parts.work] {
                    std::fs::create_dir(sub).map_err(io("layer"))?;
                    chown(sub, host_id(0), host_id(0)).map_err(io("ownership"))?;
                }
            }
        }
        for sub in ["", "root"] {
            chown(dir.join(sub), host_id(0), host_id(0)).map_err(io("ownership"))?;
        }
        set_mode(&dir, 0o700)?;
        let made = parts.disk.as_ref().is_some_and(|d| d.upper_dirs_made);
        if !upper_dirs || clone.is_some() {
            if made {
                upper::remove(&parts.upper).map_err(io("upper layer"))?;
            }
            return Ok(());
        }
        if !made {
            upper::make(&parts.upper).map_err(io("upper layer"))?;
        }
        upper::give(&parts.upper, host_id(0), host_id(SANDBOX_USER_UID))
            .map_err(io("upper layer ownership"))
    }

    fn init_config(
        &self,
        spec: &SandboxSpec,
        image: &Image,
        parts: &Parts,
        mounts: Mounts,
    ) -> InitConfig {
        let dir = &parts.dir;
        let s = |p: PathBuf| p.to_string_lossy().into_owned();
        let mut env = image.env.clone();
        for (k, v) in &spec.env {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        InitConfig {
            hostname: "sandbox".into(),
            root_target: s(dir.join("root")),
            image_layers: mounts
                .image_layers
                .into_iter()
                .chain([self.sudo_layer.clone()])
                .collect(),
            upper_dir: s(parts.upper.clone()),
            work_dir: s(parts.work.clone()),
            ro_binds: image.ro_binds.clone(),
            tmp_size_mib: self.cfg.tmp_size_mib,
            workdir: image.workdir.clone(),
            env,
            // Landlock would otherwise leave a writable volume, or an image's working
            // directory outside the usual ones (E2B's `/app`), read-only.
            writable_dirs: koder_image::writable_dirs(&spec.image, &image.workdir)
                .into_iter()
                .chain(
                    mounts
                        .volumes
                        .iter()
                        .filter(|v| !v.read_only)
                        .map(|v| v.target.clone()),
                )
                .collect(),
            egress: spec.egress,
            // Set by `spawn` when it takes a namespace made ahead.
            network_ready: false,
            rlimits: Rlimits {
                nofile: 65536,
                // RLIMIT_NPROC counts per host uid, and each sandbox has its own uids. It is
                // only a backstop (rootless hosts have no pids cgroup): the cgroup's pids limit,
                // which follows the session's limits, must be the one that binds.
                nproc: NPROC_BACKSTOP,
                core: 0,
            },
            // Set by `spawn::spawn_agent`, which hands the descriptors over.
            workload_cgroup_fds: 0,
            workload_joins_per_thread: false,
            volume_mounts: mounts.volumes,
            layer_mounts: mounts.layers,
        }
    }

    /// Creates the sandbox's cgroup with its two leaves under `limits`; the top group goes into
    /// `groups` at once, so teardown finds it whatever fails next. Returns the agent's leaf.
    fn create_cgroups(
        &self,
        driver: &dyn CgroupDriver,
        id: &str,
        limits: &Limits,
        groups: &mut Groups,
    ) -> Result<Box<dyn Cgroup>, RuntimeError> {
        let cg_err = |e: koder_cgroups::CgroupError| RuntimeError::Cgroup(e.to_string());
        let name = self.cgroup_name(id);
        let ready = self.ready_cgroups.as_ref().and_then(|r| r.take(&name));
        let made_ahead = ready.is_some();
        let top = groups.top.insert(match ready {
            Some(top) => top,
            None => driver.create(&name).map_err(cg_err)?,
        });
        let leaf = |leaf| match made_ahead {
            true => top.open_child(leaf),
            false => top.create_child(leaf),
        };
        let agent = leaf(AGENT_CGROUP).map_err(cg_err)?;
        let workload = leaf(WORKLOAD_CGROUP).map_err(cg_err)?;
        apply_limits(&**top, &*workload, limits)?;
        groups.workload = Some(workload);
        if let Some(ready) = &self.ready_cgroups {
            ready.refill();
        }
        Ok(agent)
    }

    /// The writable layer (`prepare_layers`, then the layers below or applied into it) and the
    /// cgroups, side by side: neither needs the other, so a cold create waits for the slower
    /// of the two (each milliseconds of disk or cgroupfs syscalls), not for their sum. What
    /// either made is in `parts` when this returns, whatever failed.
    fn prepare_layers_and_cgroups(
        &self,
        spec: &SandboxSpec,
        parts: &mut Parts,
        ids: IdMap,
        limits: &Limits,
    ) -> Result<Option<Box<dyn Cgroup>>, RuntimeError> {
        let shared = self
            .trees
            .as_ref()
            .filter(|_| !spec.layers.is_empty() && spec.layers.len() <= layers::MAX_LOWER_LAYERS);
        if let Some(clone) = &spec.disk {
            // The clone was made above the same layers, or with them applied into it.
            if !self.clones || clone.layers_below != shared.is_some() {
                return Err(RuntimeError::InvalidSpec(
                    "this sandbox cannot start from that cloned disk".into(),
                ));
            }
        }
        let mut groups = Groups::default();
        let (layers, agent_cgroup) = std::thread::scope(|scope| {
            let cgroups = self.cgroups.as_deref().map(|driver| {
                let groups = &mut groups;
                std::thread::Builder::new()
                    .name("sandbox-cgroups".into())
                    .spawn_scoped(scope, move || {
                        self.create_cgroups(driver, &spec.id, limits, groups)
                    })
            });
            let clone = spec.disk.as_ref();
            let layers = self
                .prepare_layers(parts, ids, limits.disk_mib, shared.is_none(), clone)
                .and_then(|()| match shared {
                    Some(trees) => {
                        parts.leases = trees.lease(&spec.layers)?;
                        Ok(())
                    }
                    // A clone holds the layers applied to the disk it was cloned from.
                    None if clone.is_some() => Ok(()),
                    None => layers::apply(&parts.upper, &spec.layers, ids, limits.disk_mib),
                });
            let agent_cgroup = match cgroups {
                None => Ok(None),
                Some(Err(e)) => Err(RuntimeError::io("start a thread for the cgroups")(e)),
                Some(Ok(thread)) => thread
                    .join()
                    .unwrap_or_else(|_| {
                        Err(RuntimeError::Cgroup("the cgroup thread panicked".into()))
                    })
                    .map(Some),
            };
            (layers, agent_cgroup)
        });
        parts.cgroup = groups.top;
        parts.workload = groups.workload;
        layers?;
        agent_cgroup
    }

    /// Attaches the volumes and shared layers of the sandbox, id-mapped for `slot`, under its
    /// directory; returns what the agent mounts.
    ///
    /// A store image's tree is the daemon's own: attached id-mapped as the lowest shared
    /// layer, its files are the sandbox's own users' (root's are its root's), so a build step
    /// (apt, dpkg) or a session can change them in its upper layer. `host` is the host's own
    /// directories and is not mapped (its files show as `nobody`).
    fn attach_mounts(
        &self,
        spec: &SandboxSpec,
        image: &Image,
        parts: &Parts,
        slot: u32,
        ids: IdMap,
    ) -> Result<Mounts, RuntimeError> {
        let image_tree =
            (self.trees.is_some() && !image::is_host(&spec.image)).then_some(image.layer.as_path());
        let image_layers = match image_tree {
            Some(_) => Vec::new(),
            None => vec![image.layer.to_string_lossy().into_owned()],
        };
        if spec.volumes.is_empty() && parts.leases.is_empty() && image_tree.is_none() {
            return Ok(Mounts {
                volumes: Vec::new(),
                layers: Vec::new(),
                image_layers,
            });
        }
        let userns = self.user_namespaces.for_slot(slot, ids)?;
        let volume_mounts = if spec.volumes.is_empty() {
            Vec::new()
        } else {
            volumes::attach(&parts.dir, &spec.volumes, userns.as_fd(), ids.host_base)?
        };
        // Top first, as overlayfs stacks them.
        let trees: Vec<&Path> = parts
            .leases
            .iter()
            .rev()
            .map(|l| l.path())
            .chain(image_tree)
            .collect();
        let layer_mounts = if trees.is_empty() {
            Vec::new()
        } else {
            volumes::attach_layers(&parts.dir, &trees, userns.as_fd(), ids.host_base)?
        };
        Ok(Mounts {
            volumes: volume_mounts,
            layers: layer_mounts,
            image_layers,
        })
    }

    /// Everything of a start up to the agent's clone; blocking throughout (disk, mounts,
    /// cgroupfs), so it runs on a blocking thread.
    fn spawn(
        &self,
        spec: &SandboxSpec,
        slot: u32,
        parts: &mut Parts,
    ) -> Result<spawn::Spawned, RuntimeError> {
        // Read here, on the blocking thread: a store image is a manifest on disk.
        let image = image::resolve(&self.image, self.cfg.images.as_ref(), &spec.image)?;
        let ids = self.ids_for(slot);
        let limits = self.effective_limits(spec.limits);
        let agent_cgroup = self.prepare_layers_and_cgroups(spec, parts, ids, &limits)?;
        let workload_joins = match &parts.workload {
            Some(workload) => open_join_files(&**workload)?,
            None => Vec::new(),
        };
        let mounts = self.attach_mounts(spec, &image, parts, slot, ids)?;
        let _ = std::fs::remove_file(&parts.socket);
        let listener = std::os::unix::net::UnixListener::bind(&parts.socket)
            .map_err(RuntimeError::io("bind agent socket"))?;
        let mut init = self.init_config(spec, &image, parts, mounts);
        let netns = self.ready_netns.as_ref().and_then(|r| r.take(spec.egress));
        init.network_ready = netns.is_some();
        init.workload_joins_per_thread = parts
            .workload
            .as_ref()
            .is_some_and(|w| w.joins_per_thread());
        // On v2 the agent is cloned straight into its leaf; on v1 its clone joins it before
        // the exec (see `spawn`: a move by pid could wait for an RCU grace period).
        let into_cgroup = match (&self.cgroups, &agent_cgroup) {
            (Some(driver), Some(cg)) if driver.version() == CgroupVersion::V2 => {
                cg.paths().first().map(open_cgroup_dir).transpose()?
            }
            _ => None,
        };
        let placement = match (&into_cgroup, &agent_cgroup) {
            (None, Some(cg)) => spawn::Placement::Joins(open_join_files(&**cg)?),
            _ => spawn::Placement::Into(into_cgroup.as_ref().map(AsFd::as_fd)),
        };
        let spawned = spawn::spawn_agent(
            &self.cfg.agent_bin,
            init,
            OwnedFd::from(listener),
            workload_joins,
            spawn::Start {
                ids,
                rootless: self.rootless,
                placement,
                netns: netns.as_ref().map(AsFd::as_fd),
            },
        );
        if let Some(ready) = &self.ready_netns {
            ready.refill(spec.egress);
        }
        spawned
    }
}

/// Locks `m` whatever a panic while it was held left: every lock of this crate guards state a
/// panic cannot leave half-changed (counts, lists, the last limits written).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn open_cgroup_dir(path: &PathBuf) -> Result<OwnedFd, RuntimeError> {
    std::fs::File::open(path)
        .map(OwnedFd::from)
        .map_err(RuntimeError::io(format!("open {}", path.display())))
}

/// What follows the agent's clone on the host: the sandbox's mount namespace now holds the
/// disk, the volumes and the shared layers, so the host's copies go (no sandbox mount stays
/// visible on the host, and the loop device frees itself when the sandbox ends); the agent's
/// pid is recorded for reconciliation after a crash.
fn after_clone(parts: &Parts, pid: i32) -> Result<(), RuntimeError> {
    if let Some(disk) = &parts.disk {
        disk.detach_host_mount()?;
    }
    volumes::detach_host_mounts(&parts.dir)?;
    reap::record(&parts.dir.join(AGENT_PID_FILE), &[pid])
}

/// A sandbox being started, with everything made for it so far. Dropped before
/// [`Pending::into_live`] (a failed start, or a create whose future was dropped), it is torn
/// down, its agent killed first, on a blocking thread when there is a runtime.
struct Pending(Option<Starting>);

struct Starting {
    parts: Parts,
    agent: Option<OwnedFd>,
    /// The agent's pid and its writable layer's (device, inode), once it runs.
    agent_pid: i32,
    upper: (u64, u64),
    slot: u32,
    slots: Slots,
}

impl Starting {
    fn release(self) {
        if let Some(agent) = &self.agent {
            spawn::kill_and_reap(agent);
        }
        if let Err(e) = teardown(&self.parts) {
            tracing::error!(dir = %self.parts.dir.display(), error = %e, "cleanup after failed start");
        }
        self.slots.release(self.slot);
    }
}

impl Pending {
    fn starting(&mut self) -> Result<&mut Starting, RuntimeError> {
        self.0
            .as_mut()
            .ok_or_else(|| RuntimeError::Start("sandbox already handed out".into()))
    }

    /// The blocking part of a start: returns the agent's stderr, which `wait_ready` reads.
    /// On failure everything made is gone again before this returns.
    fn spawn(
        mut self,
        inner: &Inner,
        spec: &SandboxSpec,
    ) -> Result<(Pending, OwnedFd), RuntimeError> {
        match self.try_spawn(inner, spec) {
            Ok(stderr) => Ok((self, stderr)),
            Err(e) => {
                self.release_now();
                Err(e)
            }
        }
    }

    fn try_spawn(&mut self, inner: &Inner, spec: &SandboxSpec) -> Result<OwnedFd, RuntimeError> {
        let starting = self.starting()?;
        let spawned = inner.spawn(spec, starting.slot, &mut starting.parts)?;
        starting.agent = Some(spawned.pidfd);
        starting.agent_pid = spawned.pid;
        // Before `after_clone` takes the host's mount of the disk it may be on.
        starting.upper = std::fs::metadata(&starting.parts.upper)
            .map(|m| (m.dev(), m.ino()))
            .map_err(RuntimeError::io("stat the writable layer"))?;
        after_clone(&starting.parts, spawned.pid)?;
        Ok(spawned.stderr)
    }

    fn release_now(&mut self) {
        if let Some(starting) = self.0.take() {
            starting.release();
        }
    }

    /// Tears down on a blocking thread and waits for it.
    async fn abort(mut self) {
        let starting = self.0.take();
        let _ = tokio::task::spawn_blocking(move || starting.map(Starting::release)).await;
    }

    fn into_live(mut self) -> Result<Live, RuntimeError> {
        let starting = self.starting()?;
        let pidfd = starting
            .agent
            .take()
            .ok_or_else(|| RuntimeError::Start("no agent".into()))?;
        let Some(Starting {
            parts,
            slot,
            agent_pid,
            upper,
            ..
        }) = self.0.take()
        else {
            return Err(RuntimeError::Start("sandbox already handed out".into()));
        };
        // Our child, not reaped yet: its pid names it. Without it only the stop is slower.
        let mount_ns = rustix::fs::open(
            format!("/proc/{agent_pid}/ns/mnt"),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok();
        Ok(Live {
            pidfd,
            parts,
            slot,
            agent_pid,
            upper,
            mount_ns,
        })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(starting) = self.0.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(move || starting.release())),
            Err(_) => starting.release(),
        }
    }
}

fn cgroup_limits(limits: &Limits) -> koder_cgroups::Limits {
    koder_cgroups::Limits {
        memory_max_bytes: limits.memory_mib.map(|m| m.saturating_mul(1024 * 1024)),
        cpu: limits
            .cpu_millis
            .map(|m| CpuQuota::from_millis(u64::from(m))),
        pids_max: limits.pids,
    }
}

/// The session's `limits` on the workload (its pids limit raised by the spawner thread's task
/// where the agent keeps one there), plus headroom on the top group. The CPU quota is the
/// workload's alone: v1 refuses a child quota above its parent's, which would make every raise
/// order-dependent, and the agent's CPU follows the daemon's requests anyway.
fn apply_limits(
    top: &dyn Cgroup,
    workload: &dyn Cgroup,
    limits: &Limits,
) -> Result<(), RuntimeError> {
    let session = cgroup_limits(limits);
    let for_workload = koder_cgroups::Limits {
        pids_max: session
            .pids_max
            .map(|p| p.saturating_add(spawner_tasks(workload))),
        ..session.clone()
    };
    let with_headroom = koder_cgroups::Limits {
        memory_max_bytes: session
            .memory_max_bytes
            .map(|m| m.saturating_add(AGENT_MEMORY_HEADROOM)),
        cpu: None,
        pids_max: session
            .pids_max
            .map(|p| p.saturating_add(AGENT_PIDS_HEADROOM)),
    };
    // Workload first: lowering it reclaims there, so the top group's lower limit then fits.
    workload
        .set_limits(&for_workload)
        .and_then(|()| top.set_limits(&with_headroom))
        .map_err(|e| RuntimeError::Cgroup(e.to_string()))
}

/// The tasks the agent's spawner thread takes in `workload`: [`SPAWNER_PIDS`] where the agent
/// keeps one there (v1), else none.
fn spawner_tasks(workload: &dyn Cgroup) -> u64 {
    match workload.joins_per_thread() {
        true => SPAWNER_PIDS,
        false => 0,
    }
}

/// The files a process joins `group` through, opened by the daemon (the sandbox's uids could
/// not): the agent's clone joins its own group through them, the agent's children the
/// workload.
fn open_join_files(group: &dyn Cgroup) -> Result<Vec<OwnedFd>, RuntimeError> {
    group
        .join_files()
        .iter()
        .map(|path| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map(OwnedFd::from)
                .map_err(RuntimeError::io(format!("open {}", path.display())))
        })
        .collect()
}

/// What the agent mounts besides its root's upper layer: volumes, the shared layers (detached
/// id-mapped mounts, top first) and the image's layers given by host path (an unmapped image).
struct Mounts {
    volumes: Vec<InitVolume>,
    layers: Vec<String>,
    image_layers: Vec<String>,
}

/// A sandbox's top cgroup and its workload leaf, as they are made.
#[derive(Default)]
struct Groups {
    top: Option<Box<dyn Cgroup>>,
    workload: Option<Box<dyn Cgroup>>,
}

/// Host-side resources of one sandbox, released in reverse order by `teardown`.
struct Parts {
    dir: PathBuf,
    socket: PathBuf,
    /// Where `dir` goes to be deleted in the background.
    trash: PathBuf,
    /// The sandbox's top cgroup; destroying it takes its leaves with it.
    cgroup: Option<Box<dyn Cgroup>>,
    /// Its `workload` leaf, which resource control and verdicts look at.
    workload: Option<Box<dyn Cgroup>>,
    /// The writable layer: on `disk` when there is one.
    upper: PathBuf,
    work: PathBuf,
    disk: Option<disk::Disk>,
    /// The shared layers below it, kept until this is dropped (after teardown: the sandbox is
    /// dead by then).
    leases: Vec<layers::Lease>,
}

impl Parts {
    fn new(dir: PathBuf, socket: PathBuf, trash: PathBuf, cgroup: Option<Box<dyn Cgroup>>) -> Self {
        Self {
            upper: dir.join("upper"),
            work: dir.join("work"),
            dir,
            socket,
            trash,
            cgroup,
            workload: None,
            disk: None,
            leases: Vec::new(),
        }
    }
}

/// Reads the agent's set-up log until it closes stderr (set-up done) and checks its health; on
/// failure the log is the error message. The health request goes out while the agent still
/// sets up: the daemon bound the listener before the clone, so the connection waits in its
/// backlog and the agent answers the moment it serves, with no round trip after the set-up.
/// An agent that dies instead closes the listener, which fails the waiting request.
async fn wait_ready(stderr: OwnedFd, socket: &Path) -> Result<AgentClient, RuntimeError> {
    let (log, agent) = tokio::join!(read_setup_log(stderr), async {
        let agent = AgentClient::connect_unix(socket)
            .await
            .map_err(|e| format!("agent unreachable: {e}"))?;
        match agent.health().await {
            Ok(_) => Ok(agent),
            Err(e) => Err(format!("agent unhealthy: {e}")),
        }
    });
    let log = log?;
    agent.map_err(|e| RuntimeError::Start(if log.is_empty() { e } else { log }))
}

/// What the agent wrote on stderr while it set up, until it closed it.
async fn read_setup_log(stderr: OwnedFd) -> Result<String, RuntimeError> {
    const MAX_LOG: usize = 16 * 1024;
    let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(stderr)
        .map_err(RuntimeError::io("agent stderr"))?;
    let mut log = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        use tokio::io::AsyncReadExt;
        match pipe.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                let room = MAX_LOG.saturating_sub(log.len());
                log.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) => return Err(RuntimeError::io("read agent stderr")(e)),
        }
    }
    Ok(String::from_utf8_lossy(&log).trim().to_string())
}

#[async_trait]
impl Runtime for JailRuntime {
    fn name(&self) -> &'static str {
        "jail"
    }

    fn enforcement(&self) -> &Enforcement {
        &self.inner.enforcement
    }

    fn is_full(&self) -> bool {
        self.inner.slots.all_used()
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Arc<dyn Sandbox>, RuntimeError> {
        let inner = &self.inner;
        validate_id(&spec.id)?;
        inner.check_volumes(&spec)?;
        let slot = inner.slots.acquire()?;
        let parts = inner.parts(&spec.id, None);
        if parts.dir.exists() {
            inner.slots.release(slot);
            return Err(RuntimeError::InvalidSpec(format!(
                "sandbox {} already exists",
                spec.id
            )));
        }
        let pending = Pending(Some(Starting {
            parts,
            agent: None,
            agent_pid: 0,
            upper: (0, 0),
            slot,
            slots: inner.slots.clone(),
        }));
        // Disk, mounts, cgroupfs and the clone block for milliseconds: not on a worker other
        // requests wait for. Should this future be dropped meanwhile, the task still finishes
        // and its `Pending` tears itself down.
        let (blocking, task_spec) = (inner.clone(), spec.clone());
        let (pending, stderr) =
            tokio::task::spawn_blocking(move || pending.spawn(&blocking, &task_spec))
                .await
                .map_err(|e| RuntimeError::Start(format!("start task: {e}")))??;
        let socket = run_dir(&inner.cfg).join(format!("{}.sock", spec.id));
        let ready =
            tokio::time::timeout(inner.cfg.start_timeout, wait_ready(stderr, &socket)).await;
        let error = match ready {
            Ok(Ok(agent)) => {
                let live = pending.into_live()?;
                let has_cgroup = live.parts.cgroup.is_some();
                return Ok(Arc::new(JailSandbox {
                    id: spec.id,
                    has_cgroup,
                    applied_limits: std::sync::Mutex::new(
                        has_cgroup.then(|| cgroup_limits(&inner.effective_limits(spec.limits))),
                    ),
                    layers_below: !live.parts.leases.is_empty(),
                    clones: inner.clones,
                    trees: inner.trees.clone(),
                    ids: inner.ids_for(slot),
                    agent,
                    state: tokio::sync::Mutex::new(Some(live)),
                    slots: inner.slots.clone(),
                }));
            }
            Ok(Err(e)) => e,
            Err(_) => RuntimeError::Start(format!(
                "agent not ready within {:?}",
                inner.cfg.start_timeout
            )),
        };
        pending.abort().await;
        Err(error)
    }

    async fn reconcile(&self) -> Result<ReconcileReport, RuntimeError> {
        let inner = &self.inner;
        let mut report = ReconcileReport::default();
        // Called at start and at the final sweep: neither wants cgroups or network namespaces
        // made ahead (a later create makes more).
        let (cgroups, netns) = (inner.ready_cgroups.clone(), inner.ready_netns.clone());
        blocking(move || {
            cgroups.iter().for_each(|c| c.clear());
            netns.iter().for_each(|n| n.clear());
            Ok(())
        })
        .await?;
        let mut names: Vec<String> = Vec::new();
        if let Some(driver) = &inner.cgroups {
            let all = driver
                .list()
                .map_err(|e| RuntimeError::Cgroup(e.to_string()))?;
            // Only this runtime's own cgroups: other daemons may share the parent.
            names.extend(
                all.iter()
                    .filter_map(|n| n.strip_prefix(&inner.cgroup_prefix))
                    .map(String::from),
            );
        }
        let entries = std::fs::read_dir(sandboxes_dir(&inner.cfg))
            .map_err(RuntimeError::io("list sandboxes"))?;
        for entry in entries.flatten() {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        names.dedup();
        for id in names.into_iter().filter(|n| validate_id(n).is_ok()) {
            let dir = sandboxes_dir(&inner.cfg).join(&id);
            // After a daemon crash the agent is no longer our child: killing it (PID 1) takes
            // its whole pid namespace.
            let agent = ExeMatch::Path(inner.cfg.agent_bin.clone());
            reap::kill_recorded(&dir.join(AGENT_PID_FILE), &agent).await;
            let cgroup = match &inner.cgroups {
                Some(d) => d.open(&inner.cgroup_name(&id)).ok(),
                None => None,
            };
            let parts = inner.parts(&id, cgroup);
            blocking(move || teardown(&parts)).await?;
            report.sandboxes_removed.push(id);
        }
        // What destroys before a crash left to delete; trees no sandbox uses any more (none
        // runs now) go with it.
        let trash = trash_dir(&inner.cfg);
        let trees = inner.trees.clone();
        blocking(move || {
            empty_trash(&trash);
            if let Some(trees) = trees {
                trees.reconcile();
            }
            Ok(())
        })
        .await?;
        Ok(report)
    }
}

/// Runs `f` on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RuntimeError> + Send + 'static,
) -> Result<T, RuntimeError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(RuntimeError::Teardown(format!("blocking task: {e}"))))
}

struct Live {
    pidfd: OwnedFd,
    parts: Parts,
    slot: u32,
    agent_pid: i32,
    /// (device, inode) of its writable layer's directory.
    upper: (u64, u64),
    /// Its mount namespace, held so that its last process's exit (what a stop waits for) does
    /// not also wait for the kernel to unmount its root, /proc, /dev... (a millisecond and
    /// more, an RCU grace period among it): they go when the teardown drops this.
    mount_ns: Option<OwnedFd>,
}

pub struct JailSandbox {
    id: String,
    has_cgroup: bool,
    /// What its cgroups hold now (`None`: unknown, after a failed write): a warm sandbox
    /// handed out with the limits it was made with needs no cgroupfs write.
    applied_limits: std::sync::Mutex<Option<koder_cgroups::Limits>>,
    /// Its captured layers are shared lower layers (not applied into its upper layer).
    layers_below: bool,
    /// Its disk can be cloned ([`Inner::clones`]).
    clones: bool,
    /// Swept at each destroy for trees whose layer went meanwhile.
    trees: Option<Arc<layers::Trees>>,
    /// Its uid range on the host.
    ids: IdMap,
    agent: AgentClient,
    state: tokio::sync::Mutex<Option<Live>>,
    slots: Slots,
}

#[async_trait]
impl Sandbox for JailSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn agent(&self) -> &AgentClient {
        &self.agent
    }

    async fn destroy(&self) -> Result<(), RuntimeError> {
        let mut state = self.state.lock().await;
        let Some(live) = state.take() else {
            return Ok(());
        };
        kill(&live).await;
        // Emptying the cgroup and removing the layers block for milliseconds: not on a worker
        // that other requests are waiting for.
        let Live {
            parts,
            slot,
            mount_ns,
            ..
        } = live;
        let trees = self.trees.clone();
        let result = blocking(move || {
            // First: the disk and the layers it held are only free once unmounted.
            drop(mount_ns);
            let done = teardown(&parts);
            // Gives its leases back (the sandbox is dead), then looks at every unused tree.
            drop(parts);
            if let Some(trees) = trees {
                trees.sweep();
            }
            done
        })
        .await;
        self.slots.release(slot);
        result
    }

    /// Its agent is PID 1 of the sandbox's pid namespace: the kernel reports it exited only
    /// once every other process there was killed and reaped.
    async fn stop(&self) -> bool {
        if let Some(live) = self.state.lock().await.as_ref() {
            kill(live).await;
        }
        true
    }

    /// Only with a cgroup (a rootless jail has none and says so at start-up).
    fn resources(&self) -> Option<&dyn ResourceControl> {
        self.has_cgroup.then_some(self as &dyn ResourceControl)
    }

    fn layers_below(&self) -> bool {
        self.layers_below
    }

    /// Only where layers can be shared lower layers (not rootless: the copy's owners are
    /// the whole sandbox range, which only root can give).
    async fn copy_writable_layer(
        &self,
        into: &Path,
        bounds: LayerBounds,
    ) -> Result<CopiedLayer, RuntimeError> {
        if self.trees.is_none() {
            return Err(RuntimeError::Unsupported(
                "an unprivileged jail cannot copy its writable layer on the host".into(),
            ));
        }
        let (pid, upper) = match self.state.lock().await.as_ref() {
            Some(live) => (live.agent_pid, live.upper),
            None => return Err(RuntimeError::Start("the sandbox was destroyed".into())),
        };
        let (ids, into) = (self.ids, into.to_path_buf());
        blocking(move || layers::copy_writable(pid, upper, ids, &into, bounds)).await
    }

    /// Where the state dir's filesystem shares blocks (FICLONE: btrfs, XFS) and the sandbox
    /// has a disk. The host reaches the disk's filesystem, to freeze it, through the agent's
    /// descriptor of the writable layer, as [`Sandbox::copy_writable_layer`] does.
    async fn clone_disk(&self, into: &Path) -> Result<Option<DiskClone>, RuntimeError> {
        if !self.clones {
            return Ok(None);
        }
        // Held throughout: a destroy, or a second clone (one freeze at a time), waits.
        let state = self.state.lock().await;
        let Some(live) = state.as_ref() else {
            return Err(RuntimeError::Start("the sandbox was destroyed".into()));
        };
        let Some(disk) = &live.parts.disk else {
            return Ok(None);
        };
        let clone = DiskClone {
            image: into.join(disk::IMAGE_NAME),
            size_mib: disk.size_mib,
            stored_ids_base: disk.stored_ids_base,
            layers_below: self.layers_below,
        };
        let (pid, upper, image, target) = (
            live.agent_pid,
            live.upper,
            disk.image.clone(),
            clone.image.clone(),
        );
        let cloned = blocking(move || {
            let fs = layers::open_agents_dir(pid, upper)?;
            disk::clone_frozen(fs.as_fd(), &image, &target)
        })
        .await;
        drop(state);
        match cloned {
            Ok(()) => Ok(Some(clone)),
            Err(RuntimeError::Unsupported(why)) => {
                tracing::warn!(why, "a fork copies files: the disk could not be cloned");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl ResourceControl for JailSandbox {
    /// What the session occupies now (memory, tasks) is the whole sandbox's, agent included,
    /// as the session's figures always were; peaks and OOM/pids counters, from which exec
    /// verdicts come, are the workload's.
    async fn usage(&self) -> Result<Usage, RuntimeError> {
        let (all, s, spawner) = self.with_cgroups(|top, workload| {
            let stats =
                |cg: &dyn Cgroup| cg.stats().map_err(|e| RuntimeError::Cgroup(e.to_string()));
            Ok((stats(top)?, stats(workload)?, spawner_tasks(workload)))
        })?;
        Ok(Usage {
            memory_current_bytes: all.memory_current_bytes,
            memory_peak_bytes: s.memory_peak_bytes,
            oom_kills: s.oom_kills,
            cpu_usage_us: s.cpu_usage_us,
            // The agent counts as the one task it always was: its spawner thread is not the
            // session's.
            pids_current: all.pids_current.saturating_sub(spawner),
            pids_max_hits: s.pids_max_hits,
        })
    }

    /// The workload's counters, through the descriptors its cgroup keeps: two reads per exec
    /// instead of the full usage of both groups.
    async fn exec_counters(&self) -> Result<koder_runtime::ExecCounters, RuntimeError> {
        let c = self.with_cgroup(|workload| workload.exec_counters())?;
        Ok(koder_runtime::ExecCounters {
            oom_kills: c.oom_kills,
            pids_max_hits: c.pids_max_hits,
        })
    }

    async fn memory_peak(&self) -> Result<u64, RuntimeError> {
        self.with_cgroup(|workload| workload.memory_peak())
    }

    async fn set_limits(&self, limits: &Limits) -> Result<(), RuntimeError> {
        let wanted = cgroup_limits(limits);
        let mut applied = lock(&self.applied_limits);
        if applied.as_ref() == Some(&wanted) {
            return Ok(());
        }
        // Half-written limits are not known: the next call writes them all again.
        *applied = None;
        self.with_cgroups(|top, workload| apply_limits(top, workload, limits))?;
        *applied = Some(wanted);
        Ok(())
    }

    async fn reset_memory_peak(&self) -> Result<(), RuntimeError> {
        self.with_cgroup(|cg| cg.reset_memory_peak())
    }

    /// Every sandbox process but the agent: a paused session runs nothing, while its agent
    /// still answers (health, and the layer capture of a snapshot taken while paused).
    async fn freeze(&self) -> Result<(), RuntimeError> {
        self.with_cgroup(|workload| workload.freeze())
    }

    async fn thaw(&self) -> Result<(), RuntimeError> {
        self.with_cgroup(|workload| workload.thaw())
    }
}

impl JailSandbox {
    /// Runs `f` on the workload's cgroup: usage, peaks, OOM and pids counters are about sandbox
    /// processes, not the agent.
    fn with_cgroup<T>(
        &self,
        f: impl FnOnce(&dyn Cgroup) -> koder_cgroups::Result<T>,
    ) -> Result<T, RuntimeError> {
        self.with_cgroups(|_, workload| {
            f(workload).map_err(|e| RuntimeError::Cgroup(e.to_string()))
        })
    }

    /// Runs `f` on the top group and the workload's leaf.
    fn with_cgroups<T>(
        &self,
        f: impl FnOnce(&dyn Cgroup, &dyn Cgroup) -> Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        let state = self
            .state
            .try_lock()
            .map_err(|_| RuntimeError::Unavailable("sandbox is being destroyed".into()))?;
        let parts = state.as_ref().map(|l| &l.parts);
        match parts.and_then(|p| p.cgroup.as_deref().zip(p.workload.as_deref())) {
            Some((top, workload)) => f(top, workload),
            None => Err(RuntimeError::Unavailable(
                "no cgroup for this sandbox".into(),
            )),
        }
    }
}

/// Kills PID 1 of the sandbox's pid namespace, which takes every sandbox process with it (the
/// cgroup kill of the teardown is the second guarantee), and waits until it has exited.
async fn kill(live: &Live) {
    let _ = rustix::process::pidfd_send_signal(&live.pidfd, rustix::process::Signal::KILL);
    wait_exit(&live.pidfd).await;
}

/// Waits (asynchronously) for the agent to exit and reaps it.
async fn wait_exit(pidfd: &OwnedFd) {
    use rustix::process::{waitid, WaitId, WaitIdOptions};
    let reap = || {
        waitid(
            WaitId::PidFd(pidfd.as_fd()),
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
        )
    };
    if let Ok(Some(_)) = reap() {
        return;
    }
    reap::wait_exited(pidfd, Duration::from_secs(5)).await;
    let _ = reap();
}

/// Removes every host-side trace of a sandbox; idempotent.
fn teardown(parts: &Parts) -> Result<(), RuntimeError> {
    let mut problems = Vec::new();
    if let Some(cg) = &parts.cgroup {
        if let Err(e) = cg.destroy() {
            problems.push(format!("cgroup: {e}"));
        }
    }
    match std::fs::remove_file(&parts.socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => problems.push(format!("socket: {e}")),
        _ => {}
    }
    // The disk (if any) is unmounted before its mount point's directory is removed; its
    // image goes with the directory.
    if let Err(e) = disk::unmount(&parts.dir) {
        problems.push(format!("disk: {e}"));
    }
    // A volume that may still be attached holds a user's files: the tree stays then.
    match volumes::remove(&parts.dir) {
        Ok(()) => {
            if let Err(e) = discard(&parts.dir, &parts.trash) {
                problems.push(format!("layers: {e}"))
            }
        }
        Err(e) => problems.push(format!("volumes: {e}")),
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(RuntimeError::Teardown(problems.join("; ")))
    }
}

/// Deletes a sandbox's directory (no volume attached: `volumes::remove` succeeded) without
/// waiting for it: the directory moves into `trash` at once and is deleted on a blocking
/// thread, since unlinking a disk image frees all its extents, which takes tens of
/// milliseconds on a busy disk. Deleted here and now where it cannot move.
fn discard(dir: &Path, trash: &Path) -> std::io::Result<()> {
    static DISCARDED: AtomicU64 = AtomicU64::new(0);
    let Some(name) = dir.file_name() else {
        return remove_tree(dir);
    };
    let to = trash.join(format!(
        "{}.{}.{}",
        name.to_string_lossy(),
        std::process::id(),
        DISCARDED.fetch_add(1, Ordering::Relaxed)
    ));
    match std::fs::rename(dir, &to) {
        Ok(()) => {
            let delete = move || {
                if let Err(e) = remove_tree(&to) {
                    tracing::warn!(dir = %to.display(), error = %e, "delete discarded sandbox");
                }
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(delete)),
                Err(_) => delete(),
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => remove_tree(dir),
    }
}

/// Deletes what [`discard`] left in `trash` (a crash, a runtime shut down first).
fn empty_trash(trash: &Path) {
    let Ok(entries) = std::fs::read_dir(trash) else {
        return;
    };
    for entry in entries.flatten() {
        if let Err(e) = remove_tree(&entry.path()) {
            tracing::warn!(dir = %entry.path().display(), error = %e, "empty trash");
        }
    }
}

/// `remove_dir_all`, also for trees with unreadable directories: overlayfs leaves a mode-000
/// `work/work`, which only root could remove as it is; a rootless daemon owns it, so it makes
/// its directories accessible again first.
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            open_up(dir);
            std::fs::remove_dir_all(dir)
        }
        other => other,
    }
}

fn open_up(dir: &Path) {
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            open_up(&entry.path());
        }
    }
}

fn sandboxes_dir(cfg: &JailConfig) -> PathBuf {
    cfg.state_dir.join("sandboxes")
}

fn run_dir(cfg: &JailConfig) -> PathBuf {
    cfg.state_dir.join("run")
}

fn trash_dir(cfg: &JailConfig) -> PathBuf {
    cfg.state_dir.join("trash")
}
