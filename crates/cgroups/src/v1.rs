//! cgroup v1 backend: one directory per controller hierarchy.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use tracing::debug;

use crate::error::CgroupError;
use crate::fsutil::{self, HeldFile};
use crate::{
    validate_name, Cgroup, CgroupDriver, CgroupVersion, ExecCounters, Limits, Result, Stats,
    FREEZE_TIMEOUT,
};

/// Inside `kill_all` a stalled freeze (task stuck in uninterruptible
/// sleep) must not eat the whole kill budget.
const KILL_FREEZE_WAIT: Duration = Duration::from_millis(250);
const RMDIR_TIMEOUT: Duration = Duration::from_secs(1);

/// The v1 controllers the sandbox needs; all are required.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum V1Controller {
    Memory,
    Cpu,
    Cpuacct,
    Pids,
    Freezer,
}

impl V1Controller {
    pub const ALL: [V1Controller; 5] = [
        V1Controller::Memory,
        V1Controller::Cpu,
        V1Controller::Cpuacct,
        V1Controller::Pids,
        V1Controller::Freezer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            V1Controller::Memory => "memory",
            V1Controller::Cpu => "cpu",
            V1Controller::Cpuacct => "cpuacct",
            V1Controller::Pids => "pids",
            V1Controller::Freezer => "freezer",
        }
    }

    pub fn from_name(name: &str) -> Option<V1Controller> {
        V1Controller::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// One path per controller. Co-mounted controllers (`cpu,cpuacct`) share a
/// path, so anything done "once per hierarchy" goes through `distinct()`.
#[derive(Debug, Clone)]
struct Dirs {
    memory: PathBuf,
    cpu: PathBuf,
    cpuacct: PathBuf,
    pids: PathBuf,
    freezer: PathBuf,
}

impl Dirs {
    fn join(&self, rel: &str) -> Dirs {
        Dirs {
            memory: self.memory.join(rel),
            cpu: self.cpu.join(rel),
            cpuacct: self.cpuacct.join(rel),
            pids: self.pids.join(rel),
            freezer: self.freezer.join(rel),
        }
    }

    fn distinct(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::with_capacity(5);
        for p in [
            &self.memory,
            &self.cpu,
            &self.cpuacct,
            &self.pids,
            &self.freezer,
        ] {
            if !out.contains(p) {
                out.push(p.clone());
            }
        }
        out
    }
}

#[derive(Debug)]
pub struct V1Driver {
    parent_dirs: Dirs,
}

impl V1Driver {
    /// `roots` maps each controller to its hierarchy's mount point; sandbox
    /// cgroups are created at `<root>/<parent>/<name>` in every hierarchy.
    pub fn new(roots: HashMap<V1Controller, PathBuf>, parent: &str) -> Result<V1Driver> {
        validate_name(parent)?;
        let get = |c: V1Controller| {
            roots.get(&c).cloned().ok_or_else(|| {
                CgroupError::NoHierarchy(format!("no v1 mount for the {} controller", c.name()))
            })
        };
        let roots = Dirs {
            memory: get(V1Controller::Memory)?,
            cpu: get(V1Controller::Cpu)?,
            cpuacct: get(V1Controller::Cpuacct)?,
            pids: get(V1Controller::Pids)?,
            freezer: get(V1Controller::Freezer)?,
        };
        Ok(V1Driver {
            parent_dirs: roots.join(parent),
        })
    }
}

impl CgroupDriver for V1Driver {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V1
    }

    fn create(&self, name: &str) -> Result<Box<dyn Cgroup>> {
        validate_name(name)?;
        for p in self.parent_dirs.distinct() {
            fsutil::mkdir(&p)?;
        }
        Ok(Box::new(V1Cgroup::make(
            name.to_string(),
            self.parent_dirs.join(name),
        )?))
    }

    fn open(&self, name: &str) -> Result<Box<dyn Cgroup>> {
        validate_name(name)?;
        let dirs = self.parent_dirs.join(name);
        if !dirs.distinct().iter().any(|d| d.is_dir()) {
            return Err(CgroupError::NotFound { path: dirs.memory });
        }
        Ok(Box::new(V1Cgroup::new(name.to_string(), dirs)))
    }

    fn rename(&self, from: &str, to: &str) -> Result<Box<dyn Cgroup>> {
        validate_name(from)?;
        validate_name(to)?;
        let (old, new) = (self.parent_dirs.join(from), self.parent_dirs.join(to));
        let pairs: Vec<(PathBuf, PathBuf)> =
            old.distinct().into_iter().zip(new.distinct()).collect();
        for (done, (o, n)) in pairs.iter().enumerate() {
            // rename(2) would replace an empty directory `to`: a group never takes another's place.
            let failure = match n.exists() {
                true => CgroupError::AlreadyExists { path: n.clone() },
                false => match std::fs::rename(o, n) {
                    Ok(()) => continue,
                    Err(e) => CgroupError::io("rename", o, e),
                },
            };
            for (o, n) in pairs[..done].iter().rev() {
                if let Err(e) = std::fs::rename(n, o) {
                    debug!(error = %e, "rollback of a partial cgroup rename failed");
                }
            }
            return Err(failure);
        }
        Ok(Box::new(V1Cgroup::new(to.to_string(), new)))
    }

    fn list(&self) -> Result<Vec<String>> {
        // Union over hierarchies: a crash mid-create can leave a cgroup in
        // only some of them, and those need reaping too.
        let mut names = Vec::new();
        for p in self.parent_dirs.distinct() {
            fsutil::list_child_dirs(&p, &mut names)?;
        }
        names.sort();
        names.dedup();
        Ok(names)
    }
}

pub(crate) struct V1Cgroup {
    name: String,
    dirs: Dirs,
    held: Held,
}

/// The files every exec reads, kept open (see [`HeldFile`]).
struct Held {
    /// `oom_kill` (kernel >= 4.13); failcnt would count every limit hit, most of which
    /// reclaim succeeds for.
    oom_control: HeldFile,
    /// `max`: forks refused at `pids.max`.
    pids_events: HeldFile,
    /// `memory.max_usage_in_bytes`: read for the peak, written to reset it.
    peak: HeldFile,
}

impl Held {
    fn new(dirs: &Dirs) -> Self {
        Self {
            oom_control: HeldFile::read_only(dirs.memory.join("memory.oom_control")),
            pids_events: HeldFile::read_only(dirs.pids.join("pids.events")),
            peak: HeldFile::writable(dirs.memory.join("memory.max_usage_in_bytes")),
        }
    }

    fn close(&self) {
        for f in [&self.oom_control, &self.pids_events, &self.peak] {
            f.close();
        }
    }
}

impl V1Cgroup {
    fn new(name: String, dirs: Dirs) -> V1Cgroup {
        let held = Held::new(&dirs);
        V1Cgroup { name, dirs, held }
    }

    /// Creates `dirs` in every hierarchy, all or none.
    fn make(name: String, dirs: Dirs) -> Result<V1Cgroup> {
        let mut made: Vec<PathBuf> = Vec::new();
        for d in dirs.distinct() {
            let failure = match fsutil::mkdir(&d) {
                Ok(true) => {
                    made.push(d);
                    continue;
                }
                Ok(false) => CgroupError::AlreadyExists { path: d },
                Err(e) => e,
            };
            // Don't leave a half-created cgroup behind for reconciliation
            // to trip over.
            for m in made.iter().rev() {
                if let Err(e) = fsutil::rmdir(m, RMDIR_TIMEOUT) {
                    debug!(error = %e, "rollback of partial cgroup failed");
                }
            }
            return Err(failure);
        }
        Ok(V1Cgroup::new(name, dirs))
    }

    fn child(&self, name: &str) -> Result<V1Cgroup> {
        validate_name(name)?;
        Ok(V1Cgroup::new(
            format!("{}/{name}", self.name),
            self.dirs.join(name),
        ))
    }

    fn freezer_state(&self) -> PathBuf {
        self.dirs.freezer.join("freezer.state")
    }

    fn wait_freezer(&self, want: &str, timeout: Duration) -> Result<bool> {
        let path = self.freezer_state();
        fsutil::poll_until(timeout, || Ok(fsutil::read_string(&path)?.trim() == want))
    }

    /// Freeze for `kill_all`: a missing freezer dir or a stalled freeze is
    /// reported as `false` rather than an error, because killing unfrozen
    /// is still better than not killing.
    fn try_freeze(&self, timeout: Duration) -> Result<bool> {
        match fsutil::write_str(&self.freezer_state(), "FROZEN") {
            Ok(()) => {}
            Err(CgroupError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Ok(false)
            }
            Err(e) => return Err(e),
        }
        self.wait_freezer("FROZEN", timeout)
    }

    fn write_thawed(&self) -> Result<()> {
        match fsutil::write_str(&self.freezer_state(), "THAWED") {
            Err(CgroupError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Ok(())
            }
            other => other,
        }
    }

    fn set_memory(&self, max: Option<u64>) -> Result<()> {
        let dir = &self.dirs.memory;
        let limit = dir.join("memory.limit_in_bytes");
        let memsw = dir.join("memory.memsw.limit_in_bytes");
        let value = max.map_or_else(|| "-1".to_string(), |v| v.to_string());
        // memsw only exists with swap accounting. Setting it equal to the
        // memory limit forbids swap. The kernel insists memsw >= limit at
        // every step, so raise memsw first and lower it last.
        if memsw.exists() {
            let current = fsutil::read_u64(&limit)?;
            let target = max.unwrap_or(u64::MAX);
            if target >= current {
                fsutil::write_str(&memsw, &value)?;
                fsutil::write_str(&limit, &value)?;
            } else {
                fsutil::write_str(&limit, &value)?;
                fsutil::write_str(&memsw, &value)?;
            }
        } else {
            fsutil::write_str(&limit, &value)?;
        }
        // Belt and braces against swap where memsw is unavailable; the
        // kernel refuses it in some setups, which is not worth failing for.
        let swappiness = dir.join("memory.swappiness");
        if swappiness.exists() {
            if let Err(e) = fsutil::write_str(&swappiness, "0") {
                debug!(error = %e, "could not set memory.swappiness");
            }
        }
        Ok(())
    }

    fn set_cpu(&self, quota: Option<crate::CpuQuota>) -> Result<()> {
        let quota_path = self.dirs.cpu.join("cpu.cfs_quota_us");
        let period_path = self.dirs.cpu.join("cpu.cfs_period_us");
        match quota {
            None => {
                if quota_path.exists() {
                    fsutil::write_str(&quota_path, "-1")?;
                }
            }
            Some(q) => {
                if !quota_path.exists() {
                    return Err(CgroupError::Unsupported {
                        what: "CFS bandwidth control",
                        path: quota_path,
                    });
                }
                // Lift the quota before changing the period so the
                // intermediate quota/period pair can't be rejected.
                fsutil::write_str(&quota_path, "-1")?;
                fsutil::write_str(&period_path, &q.period_us.to_string())?;
                fsutil::write_str(&quota_path, &q.quota_us.to_string())?;
            }
        }
        Ok(())
    }
}

impl Cgroup for V1Cgroup {
    fn name(&self) -> &str {
        &self.name
    }

    fn paths(&self) -> Vec<PathBuf> {
        self.dirs.distinct()
    }

    /// `tasks`, not `cgroup.procs`: writing `0` there moves only the writing thread, which the
    /// kernel does without its global threadgroup lock. Taking that lock (any `cgroup.procs`
    /// write, or a pid written anywhere) after ~30 ms without a taker waits for an RCU grace
    /// period: ~6 ms here, paid by the first exec after every pause of a session. For a
    /// single-threaded writer the two moves are the same.
    fn join_files(&self) -> Vec<PathBuf> {
        self.dirs
            .distinct()
            .into_iter()
            .map(|p| p.join("tasks"))
            .collect()
    }

    fn joins_per_thread(&self) -> bool {
        true
    }

    fn create_child(&self, name: &str) -> Result<Box<dyn Cgroup>> {
        let child = self.child(name)?;
        Ok(Box::new(V1Cgroup::make(child.name, child.dirs)?))
    }

    fn open_child(&self, name: &str) -> Result<Box<dyn Cgroup>> {
        let child = self.child(name)?;
        if !child.dirs.distinct().iter().any(|d| d.is_dir()) {
            return Err(CgroupError::NotFound {
                path: child.dirs.memory,
            });
        }
        Ok(Box::new(child))
    }

    fn add_process(&self, pid: u32) -> Result<()> {
        fsutil::check_pid(pid)?;
        let pid = pid.to_string();
        for d in self.dirs.distinct() {
            fsutil::write_str(&d.join("cgroup.procs"), &pid)?;
        }
        Ok(())
    }

    fn set_limits(&self, limits: &Limits) -> Result<()> {
        limits.validate()?;
        self.set_memory(limits.memory_max_bytes)?;
        self.set_cpu(limits.cpu)?;
        let pids_max = limits
            .pids_max
            .map_or_else(|| "max".to_string(), |v| v.to_string());
        fsutil::write_str(&self.dirs.pids.join("pids.max"), &pids_max)
    }

    fn stats(&self) -> Result<Stats> {
        let mem = &self.dirs.memory;
        let counters = self.exec_counters()?;
        Ok(Stats {
            memory_current_bytes: fsutil::read_u64(&mem.join("memory.usage_in_bytes"))?,
            memory_peak_bytes: self.memory_peak()?,
            oom_kills: counters.oom_kills,
            cpu_usage_us: fsutil::read_u64(&self.dirs.cpuacct.join("cpuacct.usage"))? / 1000,
            cpu_throttled_us: fsutil::read_keyed_opt(
                &self.dirs.cpu.join("cpu.stat"),
                "throttled_time",
            )?
            .map(|ns| ns / 1000),
            pids_current: fsutil::read_u64(&self.dirs.pids.join("pids.current"))?,
            pids_max_hits: counters.pids_max_hits,
        })
    }

    fn exec_counters(&self) -> Result<ExecCounters> {
        fsutil::exec_counters(&self.held.oom_control, &self.held.pids_events)
    }

    fn memory_peak(&self) -> Result<u64> {
        self.held.peak.read_present(fsutil::parse_u64)
    }

    fn reset_memory_peak(&self) -> Result<()> {
        // Any write resets the high-water mark to current usage.
        if self.held.peak.write(b"0")? {
            Ok(())
        } else {
            Err(self.held.peak.missing())
        }
    }

    fn freeze(&self) -> Result<()> {
        fsutil::write_str(&self.freezer_state(), "FROZEN")?;
        if self.wait_freezer("FROZEN", FREEZE_TIMEOUT)? {
            return Ok(());
        }
        // Don't leave the group stuck half-way in FREEZING.
        if let Err(e) = self.write_thawed() {
            debug!(error = %e, "thaw after failed freeze");
        }
        Err(CgroupError::Timeout {
            what: "freezer.state FROZEN",
            path: self.freezer_state(),
            waited: FREEZE_TIMEOUT,
        })
    }

    fn thaw(&self) -> Result<()> {
        fsutil::write_str(&self.freezer_state(), "THAWED")?;
        if self.wait_freezer("THAWED", FREEZE_TIMEOUT)? {
            return Ok(());
        }
        Err(CgroupError::Timeout {
            what: "freezer.state THAWED",
            path: self.freezer_state(),
            waited: FREEZE_TIMEOUT,
        })
    }

    fn kill_all(&self) -> Result<()> {
        fsutil::freeze_kill_loop(
            &self.dirs.freezer.join("cgroup.procs"),
            || self.pids(),
            || self.try_freeze(KILL_FREEZE_WAIT),
            || self.write_thawed(),
        )
    }

    fn pids(&self) -> Result<Vec<u32>> {
        // Union over hierarchies in case add_process failed part-way.
        let mut all = Vec::new();
        for d in self.dirs.distinct() {
            all.extend(fsutil::read_pids_or_empty(&d.join("cgroup.procs"))?);
        }
        all.sort_unstable();
        all.dedup();
        Ok(all)
    }

    fn destroy(&self) -> Result<()> {
        // Union over hierarchies, like `list`: a crash mid-create can leave
        // a child in only some of them.
        let mut children = Vec::new();
        for d in self.dirs.distinct() {
            fsutil::list_child_dirs(&d, &mut children)?;
        }
        children.sort();
        children.dedup();
        for name in children {
            self.child(&name)?.destroy()?;
        }
        self.kill_all()?;
        self.held.close();
        for d in self.dirs.distinct() {
            fsutil::rmdir(&d, RMDIR_TIMEOUT)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{populate_v1, read, v1_roots, write};
    use crate::{CpuQuota, ExecCounters};

    const MIB: u64 = 1024 * 1024;

    fn setup(comount: bool) -> (tempfile::TempDir, V1Driver, HashMap<V1Controller, PathBuf>) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let roots = v1_roots(tmp.path(), comount);
        let driver = V1Driver::new(roots.clone(), "koder-sandbox").expect("driver");
        (tmp, driver, roots)
    }

    fn dir(roots: &HashMap<V1Controller, PathBuf>, c: V1Controller, name: &str) -> PathBuf {
        roots[&c].join("koder-sandbox").join(name)
    }

    #[test]
    fn new_requires_every_controller() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut roots = v1_roots(tmp.path(), false);
        roots.remove(&V1Controller::Freezer);
        let err = V1Driver::new(roots, "koder-sandbox").expect_err("must fail");
        assert!(matches!(err, CgroupError::NoHierarchy(_)));
    }

    #[test]
    fn create_open_list() {
        for comount in [false, true] {
            let (_tmp, driver, roots) = setup(comount);
            assert_eq!(driver.version(), CgroupVersion::V1);
            assert!(driver.list().expect("list").is_empty());
            let cg = driver.create("box1").expect("create");
            assert_eq!(cg.name(), "box1");
            for c in V1Controller::ALL {
                assert!(dir(&roots, c, "box1").is_dir(), "{c:?}");
            }
            assert_eq!(cg.paths().len(), if comount { 4 } else { 5 });

            let err = driver.create("box1").err().expect("duplicate");
            assert!(matches!(err, CgroupError::AlreadyExists { .. }));
            driver.create("box2").expect("create box2");
            assert_eq!(driver.list().expect("list"), vec!["box1", "box2"]);

            assert_eq!(driver.open("box1").expect("open").name(), "box1");
            let err = driver.open("nope").err().expect("missing");
            assert!(matches!(err, CgroupError::NotFound { .. }));
            let err = driver.open("../etc").err().expect("bad name");
            assert!(matches!(err, CgroupError::InvalidName { .. }));
        }
    }

    #[test]
    fn rename_moves_every_hierarchy_or_none() {
        for comount in [false, true] {
            let (_tmp, driver, roots) = setup(comount);
            driver
                .create("made")
                .and_then(|cg| cg.create_child("leaf"))
                .expect("create");
            let cg = driver.rename("made", "box").expect("rename");
            assert_eq!(cg.name(), "box");
            for c in V1Controller::ALL {
                assert!(dir(&roots, c, "box/leaf").is_dir(), "{c:?}");
                assert!(!dir(&roots, c, "made").exists(), "{c:?}");
            }
            // A name taken in one hierarchy leaves the group as it was in all of them.
            driver.create("made").expect("create again");
            fs::create_dir_all(dir(&roots, V1Controller::Pids, "taken")).expect("mkdir");
            let err = driver.rename("made", "taken").err().expect("taken");
            assert!(matches!(err, CgroupError::AlreadyExists { .. }), "{err}");
            for c in V1Controller::ALL {
                assert!(dir(&roots, c, "made").is_dir(), "{c:?}");
            }
            assert!(!dir(&roots, V1Controller::Memory, "taken").exists());
            let err = driver.rename("made", "../x").err().expect("bad name");
            assert!(matches!(err, CgroupError::InvalidName { .. }));
            let err = driver.rename("gone", "other").err().expect("missing");
            assert!(matches!(err, CgroupError::Io { .. }), "{err}");
        }
    }

    #[test]
    fn list_includes_partial_leftovers_and_skips_junk() {
        let (_tmp, driver, roots) = setup(false);
        fs::create_dir_all(dir(&roots, V1Controller::Pids, "half")).expect("mkdir");
        fs::create_dir_all(dir(&roots, V1Controller::Memory, ".hidden")).expect("mkdir");
        write(&roots[&V1Controller::Memory].join("koder-sandbox/file"), "");
        assert_eq!(driver.list().expect("list"), vec!["half"]);
        // A half-created leftover can still be opened and destroyed.
        let cg = driver.open("half").expect("open partial");
        cg.destroy().expect("destroy partial");
        assert!(driver.list().expect("list").is_empty());
    }

    use std::fs;

    #[test]
    fn set_limits_writes_files() {
        let (_tmp, driver, roots) = setup(true);
        let cg = driver.create("box").expect("create");
        populate_v1(&cg.paths());
        let mem = dir(&roots, V1Controller::Memory, "box");
        let cpu = dir(&roots, V1Controller::Cpu, "box");
        let pids = dir(&roots, V1Controller::Pids, "box");

        cg.set_limits(&Limits {
            memory_max_bytes: Some(256 * MIB),
            cpu: Some(CpuQuota::from_millis(1500)),
            pids_max: Some(64),
        })
        .expect("set_limits");
        assert_eq!(read(&mem.join("memory.limit_in_bytes")), "268435456");
        assert_eq!(read(&mem.join("memory.memsw.limit_in_bytes")), "268435456");
        assert_eq!(read(&mem.join("memory.swappiness")), "0");
        assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "150000");
        assert_eq!(read(&cpu.join("cpu.cfs_period_us")), "100000");
        assert_eq!(read(&pids.join("pids.max")), "64");

        // The fake doesn't echo the kernel's value back; mimic it so the
        // raise/lower decision sees the current limit.
        write(&mem.join("memory.limit_in_bytes"), "268435456\n");
        cg.set_limits(&Limits::default()).expect("clear limits");
        assert_eq!(read(&mem.join("memory.limit_in_bytes")), "-1");
        assert_eq!(read(&mem.join("memory.memsw.limit_in_bytes")), "-1");
        assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "-1");
        assert_eq!(read(&pids.join("pids.max")), "max");
    }

    #[test]
    fn set_limits_without_swap_accounting() {
        let (_tmp, driver, roots) = setup(false);
        let cg = driver.create("box").expect("create");
        populate_v1(&cg.paths());
        let mem = dir(&roots, V1Controller::Memory, "box");
        fs::remove_file(mem.join("memory.memsw.limit_in_bytes")).expect("rm");
        fs::remove_file(mem.join("memory.swappiness")).expect("rm");
        cg.set_limits(&Limits {
            memory_max_bytes: Some(32 * MIB),
            ..Limits::default()
        })
        .expect("set_limits");
        assert_eq!(read(&mem.join("memory.limit_in_bytes")), "33554432");
        assert!(!mem.join("memory.memsw.limit_in_bytes").exists());
    }

    #[test]
    fn set_limits_rejects_bad_values() {
        let (_tmp, driver, _roots) = setup(false);
        let cg = driver.create("box").expect("create");
        populate_v1(&cg.paths());
        let bad = Limits {
            cpu: Some(CpuQuota {
                quota_us: 500,
                period_us: 100_000,
            }),
            ..Limits::default()
        };
        assert!(matches!(
            cg.set_limits(&bad).expect_err("bad"),
            CgroupError::InvalidLimit(_)
        ));
    }

    #[test]
    fn stats_parse() {
        let (_tmp, driver, _roots) = setup(true);
        let cg = driver.create("box").expect("create");
        populate_v1(&cg.paths());
        let s = cg.stats().expect("stats");
        assert_eq!(
            s,
            Stats {
                memory_current_bytes: 1_060_864,
                memory_peak_bytes: 33_554_432,
                oom_kills: 3,
                cpu_usage_us: 61_100_275,
                cpu_throttled_us: Some(2_500),
                pids_current: 2,
                pids_max_hits: 4,
            }
        );
    }

    #[test]
    fn stats_tolerate_old_kernels() {
        let (_tmp, driver, roots) = setup(false);
        let cg = driver.create("box").expect("create");
        populate_v1(&cg.paths());
        let mem = dir(&roots, V1Controller::Memory, "box");
        write(
            &mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\n",
        );
        fs::remove_file(dir(&roots, V1Controller::Cpu, "box").join("cpu.stat")).expect("rm");
        let s = cg.stats().expect("stats");
        assert_eq!(s.oom_kills, 0);
        assert_eq!(s.cpu_throttled_us, None);

        write(&mem.join("memory.usage_in_bytes"), "garbage\n");
        assert!(matches!(
            cg.stats().expect_err("parse"),
            CgroupError::Parse { .. }
        ));
    }

    #[test]
    fn add_process_and_pids() {
        let (_tmp, driver, roots) = setup(true);
        let cg = driver.create("box").expect("create");
        populate_v1(&cg.paths());
        cg.add_process(4242).expect("add");
        for d in cg.paths() {
            assert_eq!(read(&d.join("cgroup.procs")), "4242");
        }
        assert!(matches!(
            cg.add_process(0).expect_err("pid 0"),
            CgroupError::InvalidPid(_)
        ));
        assert!(matches!(
            cg.add_process(u32::MAX).expect_err("huge pid"),
            CgroupError::InvalidPid(_)
        ));
        // Union across hierarchies.
        write(
            &dir(&roots, V1Controller::Memory, "box").join("cgroup.procs"),
            "7\n4242\n",
        );
        assert_eq!(cg.pids().expect("pids"), vec![7, 4242]);
    }

    #[test]
    fn freeze_thaw_and_peak_reset() {
        let (_tmp, driver, roots) = setup(false);
        let cg = driver.create("box").expect("create");
        populate_v1(&cg.paths());
        let state = dir(&roots, V1Controller::Freezer, "box").join("freezer.state");
        // A plain file reads back what was written, i.e. "already frozen".
        cg.freeze().expect("freeze");
        assert_eq!(read(&state), "FROZEN");
        cg.thaw().expect("thaw");
        assert_eq!(read(&state), "THAWED");

        cg.reset_memory_peak().expect("reset");
        let mem = dir(&roots, V1Controller::Memory, "box");
        // One write at offset 0 through the kept descriptor (a plain file keeps its tail).
        assert!(read(&mem.join("memory.max_usage_in_bytes")).starts_with('0'));
    }

    #[test]
    fn exec_counters_through_kept_descriptors() {
        let (_tmp, driver, roots) = setup(true);
        let cg = driver.create("box").expect("create");
        populate_v1(&cg.paths());
        assert_eq!(
            cg.exec_counters().expect("counters"),
            ExecCounters {
                oom_kills: 3,
                pids_max_hits: 4,
            }
        );
        assert_eq!(cg.memory_peak().expect("peak"), 33_554_432);
        let mem = dir(&roots, V1Controller::Memory, "box");
        let pids = dir(&roots, V1Controller::Pids, "box");
        write(
            &mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 1\noom_kill 10\n",
        );
        write(&pids.join("pids.events"), "max 5\n");
        write(&mem.join("memory.max_usage_in_bytes"), "65536\n");
        assert_eq!(
            cg.exec_counters().expect("counters"),
            ExecCounters {
                oom_kills: 10,
                pids_max_hits: 5,
            }
        );
        assert_eq!(cg.memory_peak().expect("peak"), 65_536);

        // Kernels before 4.13 (no oom_kill) and without pids.events count nothing.
        let old = driver.create("old").expect("create");
        populate_v1(&old.paths());
        write(
            &dir(&roots, V1Controller::Memory, "old").join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\n",
        );
        fs::remove_file(dir(&roots, V1Controller::Pids, "old").join("pids.events")).expect("rm");
        assert_eq!(
            old.exec_counters().expect("counters"),
            ExecCounters::default()
        );
        // A group without its memory files is broken, not quiet.
        let other = driver.create("bare").expect("create");
        assert!(matches!(
            other.exec_counters().expect_err("no files"),
            CgroupError::Io { .. }
        ));
        assert!(matches!(
            other.memory_peak().expect_err("no files"),
            CgroupError::Io { .. }
        ));
    }

    #[test]
    fn children_in_every_hierarchy_and_destroyed_first() {
        for comount in [false, true] {
            let (_tmp, driver, roots) = setup(comount);
            let cg = driver.create("box").expect("create");
            let child = cg.create_child("workload").expect("child");
            assert_eq!(child.name(), "box/workload");
            for c in V1Controller::ALL {
                assert!(dir(&roots, c, "box/workload").is_dir(), "{c:?}");
            }
            let joins = child.join_files();
            assert_eq!(joins.len(), if comount { 4 } else { 5 });
            assert!(joins.iter().all(|p| p.ends_with("box/workload/tasks")));
            assert!(matches!(
                cg.create_child("workload").err().expect("dup"),
                CgroupError::AlreadyExists { .. }
            ));
            assert!(matches!(
                cg.create_child("../x").err().expect("bad"),
                CgroupError::InvalidName { .. }
            ));
            assert!(matches!(
                cg.open_child("nope").err().expect("missing"),
                CgroupError::NotFound { .. }
            ));
            // Children are a level below the sandboxes' groups.
            assert_eq!(driver.list().expect("list"), vec!["box"]);
            // A reconciling daemon opens only the top group; destroy removes the child too.
            driver
                .open("box")
                .expect("open")
                .destroy()
                .expect("destroy");
            for c in V1Controller::ALL {
                assert!(!dir(&roots, c, "box").exists(), "{c:?}");
            }
        }
    }

    #[test]
    fn partial_child_is_rolled_back() {
        let (_tmp, driver, roots) = setup(false);
        let cg = driver.create("box").expect("create");
        fs::create_dir(dir(&roots, V1Controller::Pids, "box/workload")).expect("mkdir");
        assert!(matches!(
            cg.create_child("workload").err().expect("leftover"),
            CgroupError::AlreadyExists { .. }
        ));
        assert!(!dir(&roots, V1Controller::Memory, "box/workload").exists());
        assert!(cg.open_child("workload").is_ok());
    }

    #[test]
    fn destroy_is_idempotent() {
        let (_tmp, driver, roots) = setup(true);
        let cg = driver.create("box").expect("create");
        cg.destroy().expect("destroy");
        for c in V1Controller::ALL {
            assert!(!dir(&roots, c, "box").exists());
        }
        cg.destroy().expect("destroy again");
        assert!(driver.list().expect("list").is_empty());
    }
}
