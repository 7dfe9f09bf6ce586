//! cgroup management for koder-sandbox jails.
//!
//! One [`CgroupDriver`] trait with a v1 backend ([`V1Driver`], also used on
//! hybrid hosts) and a v2 backend ([`V2Driver`]). [`detect`] picks the right
//! one from `/proc/self/mountinfo`. All sandbox cgroups live one level below
//! a single parent directory (e.g. `koder-sandbox`) so a restarted daemon can
//! find and reap leftovers with [`CgroupDriver::list`]. A sandbox cgroup may
//! have child groups of its own ([`Cgroup::create_child`]), e.g. to keep a
//! supervisor out of its workload's OOM domain.

mod error;
mod fsutil;
mod mountinfo;
mod v1;
mod v2;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

pub use error::CgroupError;
pub use v1::{V1Controller, V1Driver};
pub use v2::V2Driver;

pub type Result<T> = std::result::Result<T, CgroupError>;

/// How long `freeze`/`thaw` wait for the kernel to report the new state.
pub const FREEZE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long `kill_all` keeps trying before giving up.
pub const KILL_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest accepted cgroup name; keeps paths well clear of PATH_MAX.
pub const MAX_NAME_LEN: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// CFS bandwidth: the group may run `quota_us` of CPU time per `period_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuQuota {
    pub quota_us: u64,
    pub period_us: u64,
}

impl CpuQuota {
    pub const DEFAULT_PERIOD_US: u64 = 100_000;
    /// Kernel bounds for both v1 and v2.
    pub const MIN_US: u64 = 1_000;
    pub const MAX_PERIOD_US: u64 = 1_000_000;

    /// 1000 millis = one full CPU. The quota is raised to the kernel minimum
    /// of 1ms so tiny values still produce a valid (if very slow) limit.
    pub fn from_millis(cpu_millis: u64) -> CpuQuota {
        let quota = cpu_millis.saturating_mul(Self::DEFAULT_PERIOD_US) / 1000;
        CpuQuota {
            quota_us: quota.max(Self::MIN_US),
            period_us: Self::DEFAULT_PERIOD_US,
        }
    }

    fn validate(&self) -> Result<()> {
        if !(Self::MIN_US..=Self::MAX_PERIOD_US).contains(&self.period_us) {
            return Err(CgroupError::InvalidLimit(format!(
                "cpu period {}us outside {}..={}",
                self.period_us,
                Self::MIN_US,
                Self::MAX_PERIOD_US
            )));
        }
        // v1 takes the quota as a signed value; stay far below overflow.
        if self.quota_us < Self::MIN_US || self.quota_us > i64::MAX as u64 / 1000 {
            return Err(CgroupError::InvalidLimit(format!(
                "cpu quota {}us out of range",
                self.quota_us
            )));
        }
        Ok(())
    }
}

/// Desired limits. `set_limits` is declarative: `None` removes that limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    pub memory_max_bytes: Option<u64>,
    pub cpu: Option<CpuQuota>,
    pub pids_max: Option<u64>,
}

impl Limits {
    fn validate(&self) -> Result<()> {
        if let Some(cpu) = &self.cpu {
            cpu.validate()?;
        }
        if self.memory_max_bytes == Some(0) {
            return Err(CgroupError::InvalidLimit("memory limit of 0".into()));
        }
        // v1 takes both values as signed 64-bit.
        for (what, v) in [("memory", self.memory_max_bytes), ("pids", self.pids_max)] {
            if v.is_some_and(|v| v > i64::MAX as u64) {
                return Err(CgroupError::InvalidLimit(format!("{what} limit too large")));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub memory_current_bytes: u64,
    /// High-water mark since creation or the last `reset_memory_peak`.
    /// 0 on v2 kernels without `memory.peak` (< 5.19).
    pub memory_peak_bytes: u64,
    /// Processes killed by the OOM killer (not allocation failures).
    /// 0 on kernels that don't report it (v1 < 4.13).
    pub oom_kills: u64,
    pub cpu_usage_us: u64,
    /// `None` when CFS bandwidth accounting isn't available.
    pub cpu_throttled_us: Option<u64>,
    pub pids_current: u64,
    /// Times a fork was refused because of `pids.max`.
    pub pids_max_hits: u64,
}

/// The counters an exec's verdict is drawn from, as [`Cgroup::exec_counters`] reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecCounters {
    /// As [`Stats::oom_kills`].
    pub oom_kills: u64,
    /// As [`Stats::pids_max_hits`].
    pub pids_max_hits: u64,
}

pub trait CgroupDriver: Send + Sync {
    fn version(&self) -> CgroupVersion;
    /// Creates `<parent>/<name>` (and the parent if missing). Fails with
    /// `AlreadyExists` rather than adopting a leftover from a previous run.
    fn create(&self, name: &str) -> Result<Box<dyn Cgroup>>;
    /// Opens an existing cgroup; on v1 succeeds if it exists in any
    /// hierarchy so half-created leftovers can still be destroyed.
    fn open(&self, name: &str) -> Result<Box<dyn Cgroup>>;
    /// Names of existing cgroups under the parent, sorted.
    fn list(&self) -> Result<Vec<String>>;
    /// Renames the group `from`, its children with it, to `to` (which must not exist) in
    /// every hierarchy or in none, and opens it under its new name. cgroup2 cannot rename a
    /// group: `Unsupported` there.
    fn rename(&self, from: &str, to: &str) -> Result<Box<dyn Cgroup>>;
}

pub trait Cgroup: Send + Sync {
    fn name(&self) -> &str;
    /// Directories backing this cgroup (one per distinct v1 hierarchy, a
    /// single one on v2), e.g. for `clone3(CLONE_INTO_CGROUP)` or debugging.
    fn paths(&self) -> Vec<PathBuf>;
    fn add_process(&self, pid: u32) -> Result<()>;
    /// The files, one per distinct hierarchy, a single-threaded process writes `0` into to
    /// move itself into this group.
    fn join_files(&self) -> Vec<PathBuf>;
    /// Whether a thread writing `0` into [`Self::join_files`] moves alone, leaving its
    /// process's other threads where they are (v1 `tasks`); on v2 the whole process moves.
    fn joins_per_thread(&self) -> bool;
    /// Creates the child group `name` (a single path component). On v2 this
    /// delegates the controllers to it, which the kernel only allows while
    /// this group holds no processes: make children before adding any.
    fn create_child(&self, name: &str) -> Result<Box<dyn Cgroup>>;
    /// Opens an existing child group, as [`CgroupDriver::open`] does.
    fn open_child(&self, name: &str) -> Result<Box<dyn Cgroup>>;
    fn set_limits(&self, limits: &Limits) -> Result<()>;
    /// Every figure: for metrics and usage reports.
    fn stats(&self) -> Result<Stats>;
    /// The OOM-kill and `pids.max` counters alone, from descriptors opened on first use and
    /// kept (one `pread` each, no path walk): cheap enough for every exec.
    fn exec_counters(&self) -> Result<ExecCounters>;
    /// [`Stats::memory_peak_bytes`] alone, through a descriptor kept like those of
    /// [`Cgroup::exec_counters`] (the one `reset_memory_peak` writes to).
    fn memory_peak(&self) -> Result<u64>;
    /// Restarts peak-memory tracking. `Unsupported` where the kernel can't.
    fn reset_memory_peak(&self) -> Result<()>;
    /// Returns once the kernel reports the group frozen, or `Timeout`.
    fn freeze(&self) -> Result<()>;
    fn thaw(&self) -> Result<()>;
    /// SIGKILLs every process and waits until the group is empty.
    fn kill_all(&self) -> Result<()>;
    fn pids(&self) -> Result<Vec<u32>>;
    /// Destroys every child group first (a group with children cannot be
    /// removed, and `kill_all` only sees this group's own members), then
    /// `kill_all` and removes the directories. Idempotent.
    fn destroy(&self) -> Result<()>;
}

/// A prefix for the cgroup names of one runtime instance, derived from its state directory:
/// daemons (or test runs) sharing a cgroup parent then never reconcile each other's cgroups.
pub fn instance_prefix(state_dir: &std::path::Path) -> String {
    let path = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let hash = path
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
        });
    format!("{hash:08x}-")
}

/// Checks that `name` is a single safe path component.
pub fn validate_name(name: &str) -> Result<()> {
    let bad = |reason| {
        Err(CgroupError::InvalidName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_NAME_LEN {
        return bad("too long");
    }
    // A leading '.' also rules out "." and ".."; the charset rules out
    // '/' and NUL.
    if name.starts_with('.') {
        return bad("starts with '.'");
    }
    if !name
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    {
        return bad("only ASCII letters, digits, '-', '_' and '.' are allowed");
    }
    // Names like "cgroup.procs" would collide with control files and fail
    // with a misleading "already exists".
    const CONTROL_PREFIXES: [&str; 12] = [
        "cgroup.", "memory.", "cpu.", "cpuacct.", "cpuset.", "pids.", "freezer.", "io.", "blkio.",
        "devices.", "hugetlb.", "rdma.",
    ];
    if CONTROL_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return bad("looks like a cgroup control file");
    }
    Ok(())
}

/// The backend chosen by [`detect`].
#[derive(Debug)]
pub enum Driver {
    V1(V1Driver),
    V2(V2Driver),
}

impl Driver {
    fn inner(&self) -> &dyn CgroupDriver {
        match self {
            Driver::V1(d) => d,
            Driver::V2(d) => d,
        }
    }
}

impl CgroupDriver for Driver {
    fn version(&self) -> CgroupVersion {
        self.inner().version()
    }
    fn create(&self, name: &str) -> Result<Box<dyn Cgroup>> {
        self.inner().create(name)
    }
    fn open(&self, name: &str) -> Result<Box<dyn Cgroup>> {
        self.inner().open(name)
    }
    fn list(&self) -> Result<Vec<String>> {
        self.inner().list()
    }
    fn rename(&self, from: &str, to: &str) -> Result<Box<dyn Cgroup>> {
        self.inner().rename(from, to)
    }
}

/// Picks a backend for this host, with sandboxes under `<root>/<parent>`.
pub fn detect(parent: &str) -> Result<Driver> {
    let path = "/proc/self/mountinfo";
    let text = std::fs::read_to_string(path).map_err(|e| CgroupError::io("read", path, e))?;
    detect_from_mountinfo(&text, parent)
}

/// [`detect`] on given mountinfo text. v2 mounts are inspected on disk
/// (their `cgroup.controllers`), so tests can point them at a fake tree.
pub fn detect_from_mountinfo(mountinfo: &str, parent: &str) -> Result<Driver> {
    validate_name(parent)?;
    let mounts = mountinfo::parse(mountinfo);

    // A v2 mount only counts if it actually carries our controllers: on
    // hybrid hosts /sys/fs/cgroup/unified exists but has none.
    for m in &mounts {
        if m.kind != mountinfo::MountKind::V2 {
            continue;
        }
        let path = m.mount_point.join("cgroup.controllers");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let have: Vec<&str> = text.split_whitespace().collect();
        if v2::REQUIRED.iter().all(|c| have.contains(c)) {
            return Ok(Driver::V2(V2Driver::new(m.mount_point.clone(), parent)?));
        }
    }

    let mut roots: HashMap<V1Controller, PathBuf> = HashMap::new();
    // Prefer mounts of the hierarchy root over bind mounts of a sub-tree.
    for pass_root_only in [true, false] {
        for m in &mounts {
            let mountinfo::MountKind::V1 { controllers } = &m.kind else {
                continue;
            };
            if pass_root_only && m.root != "/" {
                continue;
            }
            for c in controllers {
                if let Some(ctrl) = V1Controller::from_name(c) {
                    roots.entry(ctrl).or_insert_with(|| m.mount_point.clone());
                }
            }
        }
    }
    let missing: Vec<&str> = V1Controller::ALL
        .iter()
        .filter(|c| !roots.contains_key(c))
        .map(|c| c.name())
        .collect();
    if missing.is_empty() {
        return Ok(Driver::V1(V1Driver::new(roots, parent)?));
    }
    Err(CgroupError::NoHierarchy(format!(
        "no cgroup2 mount with {} enabled, and no v1 mount for: {}",
        v2::REQUIRED.join("+"),
        missing.join(", ")
    )))
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod testutil;
