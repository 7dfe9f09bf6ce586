//! cgroup v2 backend: a single unified directory per cgroup.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::libc;
use tracing::debug;

use crate::error::CgroupError;
use crate::fsutil::{self, HeldFile};
use crate::{
    validate_name, Cgroup, CgroupDriver, CgroupVersion, CpuQuota, ExecCounters, Limits, Result,
    Stats, FREEZE_TIMEOUT, KILL_TIMEOUT,
};

/// Controllers that must be enabled for sandbox cgroups.
pub(crate) const REQUIRED: [&str; 3] = ["memory", "cpu", "pids"];

const KILL_FREEZE_WAIT: Duration = Duration::from_millis(250);
const RMDIR_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct V2Driver {
    root: PathBuf,
    parent: PathBuf,
}

impl V2Driver {
    /// `root` is the cgroup2 mount point (or a delegated sub-tree);
    /// sandbox cgroups live at `<root>/<parent>/<name>`.
    pub fn new(root: PathBuf, parent: &str) -> Result<V2Driver> {
        validate_name(parent)?;
        let parent = root.join(parent);
        Ok(V2Driver { root, parent })
    }

    /// Children only get a controller's files if every ancestor has it in
    /// `cgroup.subtree_control`, so make sure root and parent delegate ours.
    fn ensure_parent(&self) -> Result<()> {
        let controllers = self.root.join("cgroup.controllers");
        let text = fsutil::read_string(&controllers)?;
        let available: Vec<&str> = text.split_whitespace().collect();
        if let Some(missing) = REQUIRED.iter().find(|c| !available.contains(c)) {
            return Err(CgroupError::NoHierarchy(format!(
                "controller {missing} not available in {}",
                controllers.display()
            )));
        }
        enable_controllers(&self.root)?;
        fsutil::mkdir(&self.parent)?;
        enable_controllers(&self.parent)
    }
}

fn enable_controllers(dir: &Path) -> Result<()> {
    let path = dir.join("cgroup.subtree_control");
    let text = fsutil::read_string(&path)?;
    let enabled: Vec<&str> = text
        .split_whitespace()
        .map(|c| c.trim_start_matches('+'))
        .collect();
    let missing: Vec<String> = REQUIRED
        .iter()
        .filter(|c| !enabled.contains(c))
        .map(|c| format!("+{c}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    // EBUSY here usually means `dir` has processes of its own (the "no
    // internal processes" rule), e.g. a non-root cgroup namespace root.
    fsutil::write_str(&path, &missing.join(" "))
}

impl CgroupDriver for V2Driver {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V2
    }

    fn create(&self, name: &str) -> Result<Box<dyn Cgroup>> {
        validate_name(name)?;
        self.ensure_parent()?;
        let dir = self.parent.join(name);
        if !fsutil::mkdir(&dir)? {
            return Err(CgroupError::AlreadyExists { path: dir });
        }
        Ok(Box::new(V2Cgroup::new(name, dir)))
    }

    fn open(&self, name: &str) -> Result<Box<dyn Cgroup>> {
        validate_name(name)?;
        let dir = self.parent.join(name);
        if !dir.is_dir() {
            return Err(CgroupError::NotFound { path: dir });
        }
        Ok(Box::new(V2Cgroup::new(name, dir)))
    }

    fn rename(&self, from: &str, _to: &str) -> Result<Box<dyn Cgroup>> {
        // cgroup2's directory operations are mkdir and rmdir only.
        Err(CgroupError::Unsupported {
            what: "renaming a cgroup",
            path: self.parent.join(from),
        })
    }

    fn list(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        fsutil::list_child_dirs(&self.parent, &mut names)?;
        names.sort();
        Ok(names)
    }
}

pub(crate) struct V2Cgroup {
    name: String,
    dir: PathBuf,
    /// `oom_kill`.
    memory_events: HeldFile,
    /// `max`: forks refused at `pids.max`.
    pids_events: HeldFile,
    /// Since 6.12 a write to memory.peak resets the peak as seen through
    /// that open file only, so the reset and every later read go through
    /// this one descriptor.
    peak: HeldFile,
}

fn is_not_found(e: &CgroupError) -> bool {
    matches!(e, CgroupError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
}

impl V2Cgroup {
    fn new(name: &str, dir: PathBuf) -> V2Cgroup {
        V2Cgroup {
            name: name.to_string(),
            memory_events: HeldFile::read_only(dir.join("memory.events")),
            pids_events: HeldFile::read_only(dir.join("pids.events")),
            peak: HeldFile::writable(dir.join("memory.peak")),
            dir,
        }
    }

    fn child(&self, name: &str) -> Result<V2Cgroup> {
        validate_name(name)?;
        Ok(V2Cgroup::new(
            &format!("{}/{name}", self.name),
            self.dir.join(name),
        ))
    }

    fn frozen(&self) -> Result<bool> {
        let path = self.dir.join("cgroup.events");
        Ok(fsutil::read_keyed(&path, "frozen")? == Some(1))
    }

    fn set_freeze(&self, on: bool) -> Result<bool> {
        let path = self.dir.join("cgroup.freeze");
        if !path.exists() {
            // Either the kernel predates 5.2 or the cgroup is gone.
            return Err(if self.dir.is_dir() {
                CgroupError::Unsupported {
                    what: "cgroup v2 freezer",
                    path,
                }
            } else {
                CgroupError::NotFound {
                    path: self.dir.clone(),
                }
            });
        }
        fsutil::write_str(&path, if on { "1" } else { "0" })?;
        fsutil::poll_until(FREEZE_TIMEOUT, || Ok(self.frozen()? == on))
    }
}

impl Cgroup for V2Cgroup {
    fn name(&self) -> &str {
        &self.name
    }

    fn paths(&self) -> Vec<PathBuf> {
        vec![self.dir.clone()]
    }

    /// `cgroup.procs`: a domain group takes whole processes only.
    fn join_files(&self) -> Vec<PathBuf> {
        vec![self.dir.join("cgroup.procs")]
    }

    fn joins_per_thread(&self) -> bool {
        false
    }

    fn create_child(&self, name: &str) -> Result<Box<dyn Cgroup>> {
        let child = self.child(name)?;
        // Fails with EBUSY once this group has members (no internal processes).
        enable_controllers(&self.dir)?;
        if !fsutil::mkdir(&child.dir)? {
            return Err(CgroupError::AlreadyExists { path: child.dir });
        }
        Ok(Box::new(child))
    }

    fn open_child(&self, name: &str) -> Result<Box<dyn Cgroup>> {
        let child = self.child(name)?;
        if !child.dir.is_dir() {
            return Err(CgroupError::NotFound { path: child.dir });
        }
        Ok(Box::new(child))
    }

    fn add_process(&self, pid: u32) -> Result<()> {
        fsutil::check_pid(pid)?;
        fsutil::write_str(&self.dir.join("cgroup.procs"), &pid.to_string())
    }

    fn set_limits(&self, limits: &Limits) -> Result<()> {
        limits.validate()?;
        let memory_max = limits
            .memory_max_bytes
            .map_or_else(|| "max".to_string(), |v| v.to_string());
        fsutil::write_str(&self.dir.join("memory.max"), &memory_max)?;
        // Absent when the kernel has no swap accounting; then there's no
        // swap to worry about for this group either.
        let swap = self.dir.join("memory.swap.max");
        if swap.exists() {
            fsutil::write_str(&swap, "0")?;
        }
        let cpu_max = match limits.cpu {
            Some(q) => format!("{} {}", q.quota_us, q.period_us),
            None => format!("max {}", CpuQuota::DEFAULT_PERIOD_US),
        };
        fsutil::write_str(&self.dir.join("cpu.max"), &cpu_max)?;
        let pids_max = limits
            .pids_max
            .map_or_else(|| "max".to_string(), |v| v.to_string());
        fsutil::write_str(&self.dir.join("pids.max"), &pids_max)
    }

    fn stats(&self) -> Result<Stats> {
        let d = &self.dir;
        let cpu_path = d.join("cpu.stat");
        let cpu_stat = fsutil::read_string(&cpu_path)?;
        let counters = self.exec_counters()?;
        Ok(Stats {
            memory_current_bytes: fsutil::read_u64(&d.join("memory.current"))?,
            memory_peak_bytes: self.memory_peak()?,
            oom_kills: counters.oom_kills,
            cpu_usage_us: fsutil::parse_keyed(&cpu_path, &cpu_stat, "usage_usec")?.unwrap_or(0),
            cpu_throttled_us: fsutil::parse_keyed(&cpu_path, &cpu_stat, "throttled_usec")?,
            pids_current: fsutil::read_u64(&d.join("pids.current"))?,
            pids_max_hits: counters.pids_max_hits,
        })
    }

    fn exec_counters(&self) -> Result<ExecCounters> {
        fsutil::exec_counters(&self.memory_events, &self.pids_events)
    }

    fn memory_peak(&self) -> Result<u64> {
        // memory.peak appeared in 5.19.
        Ok(self.peak.read(fsutil::parse_u64)?.unwrap_or(0))
    }

    fn reset_memory_peak(&self) -> Result<()> {
        let unsupported = || CgroupError::Unsupported {
            what: "resetting memory.peak (needs Linux 6.12)",
            path: self.peak.path().to_path_buf(),
        };
        // Before 6.12 memory.peak is read-only (the descriptor could only be opened for
        // reading, so the write fails with EBADF; or the kernel refuses it); before 5.19 it
        // doesn't exist.
        match self.peak.write(b"reset\n") {
            Ok(true) => Ok(()),
            Ok(false) => Err(unsupported()),
            Err(CgroupError::Io { source, .. })
                if matches!(
                    source.raw_os_error(),
                    Some(libc::EBADF | libc::EACCES | libc::EPERM | libc::EINVAL)
                ) =>
            {
                Err(unsupported())
            }
            Err(e) => Err(e),
        }
    }

    fn freeze(&self) -> Result<()> {
        if self.set_freeze(true)? {
            return Ok(());
        }
        // Don't leave the group half-frozen.
        if let Err(e) = self.set_freeze(false) {
            debug!(error = %e, "thaw after failed freeze");
        }
        Err(CgroupError::Timeout {
            what: "cgroup.events frozen 1",
            path: self.dir.join("cgroup.events"),
            waited: FREEZE_TIMEOUT,
        })
    }

    fn thaw(&self) -> Result<()> {
        if self.set_freeze(false)? {
            return Ok(());
        }
        Err(CgroupError::Timeout {
            what: "cgroup.events frozen 0",
            path: self.dir.join("cgroup.events"),
            waited: FREEZE_TIMEOUT,
        })
    }

    fn kill_all(&self) -> Result<()> {
        let procs = self.dir.join("cgroup.procs");
        let kill = self.dir.join("cgroup.kill");
        if kill.exists() {
            // cgroup.kill (5.14+) also catches tasks forked mid-kill, so
            // one write suffices; we only wait for the exits.
            match fsutil::write_str(&kill, "1") {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
            if fsutil::poll_until(KILL_TIMEOUT, || Ok(self.pids()?.is_empty()))? {
                return Ok(());
            }
            return Err(CgroupError::Timeout {
                what: "all processes to exit",
                path: procs,
                waited: KILL_TIMEOUT,
            });
        }
        let freezer = self.dir.join("cgroup.freeze").exists();
        fsutil::freeze_kill_loop(
            &procs,
            || self.pids(),
            || {
                if !freezer {
                    return Ok(false);
                }
                fsutil::write_str(&self.dir.join("cgroup.freeze"), "1")?;
                fsutil::poll_until(KILL_FREEZE_WAIT, || self.frozen())
            },
            || {
                if !freezer {
                    return Ok(());
                }
                match fsutil::write_str(&self.dir.join("cgroup.freeze"), "0") {
                    Err(e) if is_not_found(&e) => Ok(()),
                    other => other,
                }
            },
        )
    }

    fn pids(&self) -> Result<Vec<u32>> {
        let mut pids = fsutil::read_pids_or_empty(&self.dir.join("cgroup.procs"))?;
        pids.sort_unstable();
        Ok(pids)
    }

    fn destroy(&self) -> Result<()> {
        let mut children = Vec::new();
        fsutil::list_child_dirs(&self.dir, &mut children)?;
        for name in children {
            self.open_child(&name)?.destroy()?;
        }
        self.kill_all()?;
        for f in [&self.memory_events, &self.pids_events, &self.peak] {
            f.close();
        }
        fsutil::rmdir(&self.dir, RMDIR_TIMEOUT)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::testutil::{populate_v2, read, v2_root, write};

    fn setup() -> (tempfile::TempDir, V2Driver, PathBuf) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = v2_root(tmp.path(), "koder-sandbox");
        let driver = V2Driver::new(root.clone(), "koder-sandbox").expect("driver");
        (tmp, driver, root)
    }

    fn make(driver: &V2Driver, name: &str) -> (Box<dyn Cgroup>, PathBuf) {
        let cg = driver.create(name).expect("create");
        let dir = cg.paths().remove(0);
        populate_v2(&dir);
        (cg, dir)
    }

    #[test]
    fn create_delegates_controllers() {
        let (_tmp, driver, root) = setup();
        assert_eq!(driver.version(), CgroupVersion::V2);
        let (cg, dir) = make(&driver, "box1");
        assert_eq!(dir, root.join("koder-sandbox/box1"));
        assert_eq!(cg.name(), "box1");
        assert_eq!(
            read(&root.join("cgroup.subtree_control")),
            "+memory +cpu +pids"
        );
        assert_eq!(
            read(&root.join("koder-sandbox/cgroup.subtree_control")),
            "+memory +cpu +pids"
        );
        // Only what's missing gets enabled.
        write(&root.join("cgroup.subtree_control"), "cpu io memory\n");
        write(
            &root.join("koder-sandbox/cgroup.subtree_control"),
            "cpu memory pids\n",
        );
        driver.create("box2").expect("create box2");
        assert_eq!(read(&root.join("cgroup.subtree_control")), "+pids");
        assert_eq!(
            read(&root.join("koder-sandbox/cgroup.subtree_control")),
            "cpu memory pids\n"
        );

        assert_eq!(driver.list().expect("list"), vec!["box1", "box2"]);
        let err = driver.create("box1").err().expect("dup");
        assert!(matches!(err, CgroupError::AlreadyExists { .. }));
        assert_eq!(driver.open("box2").expect("open").name(), "box2");
        assert!(matches!(
            driver.open("gone").err().expect("missing"),
            CgroupError::NotFound { .. }
        ));
        assert!(matches!(
            driver.create("a/b").err().expect("bad"),
            CgroupError::InvalidName { .. }
        ));
    }

    #[test]
    fn create_fails_without_controllers() {
        let (_tmp, driver, root) = setup();
        write(&root.join("cgroup.controllers"), "cpu io memory\n");
        let err = driver.create("box").err().expect("no pids");
        assert!(matches!(err, CgroupError::NoHierarchy(_)));
        assert!(!root.join("koder-sandbox/box").exists());
    }

    #[test]
    fn set_limits_writes_files() {
        let (_tmp, driver, _root) = setup();
        let (cg, dir) = make(&driver, "box");
        cg.set_limits(&Limits {
            memory_max_bytes: Some(512 * 1024 * 1024),
            cpu: Some(CpuQuota::from_millis(250)),
            pids_max: Some(128),
        })
        .expect("set_limits");
        assert_eq!(read(&dir.join("memory.max")), "536870912");
        assert_eq!(read(&dir.join("memory.swap.max")), "0");
        assert_eq!(read(&dir.join("cpu.max")), "25000 100000");
        assert_eq!(read(&dir.join("pids.max")), "128");

        fs::remove_file(dir.join("memory.swap.max")).expect("rm");
        cg.set_limits(&Limits::default()).expect("clear");
        assert_eq!(read(&dir.join("memory.max")), "max");
        assert_eq!(read(&dir.join("cpu.max")), "max 100000");
        assert_eq!(read(&dir.join("pids.max")), "max");
        assert!(!dir.join("memory.swap.max").exists());
    }

    #[test]
    fn stats_parse() {
        let (_tmp, driver, _root) = setup();
        let (cg, _dir) = make(&driver, "box");
        assert_eq!(
            cg.stats().expect("stats"),
            Stats {
                memory_current_bytes: 2_154_496,
                memory_peak_bytes: 8_388_608,
                oom_kills: 2,
                cpu_usage_us: 1234,
                cpu_throttled_us: Some(0),
                pids_current: 1,
                pids_max_hits: 4,
            }
        );
        // Pre-5.19 kernels have no memory.peak.
        let (cg, dir) = make(&driver, "old");
        fs::remove_file(dir.join("memory.peak")).expect("rm");
        assert_eq!(cg.stats().expect("stats").memory_peak_bytes, 0);
        assert_eq!(cg.memory_peak().expect("peak"), 0);
    }

    #[test]
    fn exec_counters_read_the_event_files_through_kept_descriptors() {
        let (_tmp, driver, _root) = setup();
        let (cg, dir) = make(&driver, "box");
        assert_eq!(
            cg.exec_counters().expect("counters"),
            ExecCounters {
                oom_kills: 2,
                pids_max_hits: 4,
            }
        );
        assert_eq!(cg.memory_peak().expect("peak"), 8_388_608);
        // Rewritten in place (same inode, as the kernel's files stay): the kept descriptors
        // see the new content, read again from offset 0, longer or shorter than before.
        write(
            &dir.join("memory.events"),
            "low 0\nhigh 0\nmax 17\noom 9\noom_kill 12\noom_group_kill 0\nsock_throttled 0\n",
        );
        write(&dir.join("pids.events"), "max 1234567\n");
        write(&dir.join("memory.peak"), "4096\n");
        assert_eq!(
            cg.exec_counters().expect("counters"),
            ExecCounters {
                oom_kills: 12,
                pids_max_hits: 1_234_567,
            }
        );
        assert_eq!(cg.memory_peak().expect("peak"), 4096);
        write(&dir.join("memory.events"), "oom_kill 3\n");
        write(&dir.join("pids.events"), "max 0\n");
        assert_eq!(
            cg.exec_counters().expect("counters"),
            ExecCounters {
                oom_kills: 3,
                pids_max_hits: 0,
            }
        );
    }

    #[test]
    fn exec_counters_of_older_kernels_and_broken_files() {
        let (_tmp, driver, _root) = setup();
        // No oom_kill key (before 4.13) and no pids.events: zero, as `stats` says.
        let (cg, dir) = make(&driver, "old");
        write(&dir.join("memory.events"), "low 0\nhigh 0\nmax 0\noom 0\n");
        fs::remove_file(dir.join("pids.events")).expect("rm");
        assert_eq!(
            cg.exec_counters().expect("counters"),
            ExecCounters::default()
        );
        // memory.events always exists with the memory controller: its absence is an error.
        let (cg, dir) = make(&driver, "gone");
        fs::remove_file(dir.join("memory.events")).expect("rm");
        assert!(matches!(
            cg.exec_counters().expect_err("missing"),
            CgroupError::Io { .. }
        ));
        // Garbage, and content beyond what a flat-keyed file can hold, are parse errors.
        let (cg, dir) = make(&driver, "bad");
        write(&dir.join("pids.events"), "max lots\n");
        assert!(matches!(
            cg.exec_counters().expect_err("garbage"),
            CgroupError::Parse { .. }
        ));
        write(&dir.join("pids.events"), &"max 1\n".repeat(200));
        assert!(matches!(
            cg.exec_counters().expect_err("too long"),
            CgroupError::Parse { .. }
        ));
        write(&dir.join("memory.peak"), "-1\n");
        assert!(matches!(
            cg.memory_peak().expect_err("negative"),
            CgroupError::Parse { .. }
        ));
    }

    #[test]
    fn reset_memory_peak_reads_through_kept_fd() {
        let (_tmp, driver, _root) = setup();
        let (cg, dir) = make(&driver, "box");
        cg.reset_memory_peak().expect("reset");
        assert!(read(&dir.join("memory.peak")).starts_with("reset\n"));
        // Rewriting in place keeps the inode, so the kept fd sees this.
        write(&dir.join("memory.peak"), "4096\n");
        assert_eq!(cg.stats().expect("stats").memory_peak_bytes, 4096);

        let (cg2, dir2) = make(&driver, "box2");
        fs::remove_file(dir2.join("memory.peak")).expect("rm");
        let err = cg2.reset_memory_peak().expect_err("unsupported");
        assert!(matches!(err, CgroupError::Unsupported { .. }));
    }

    #[test]
    fn freeze_and_thaw() {
        let (_tmp, driver, _root) = setup();
        let (cg, dir) = make(&driver, "box");
        write(&dir.join("cgroup.events"), "populated 1\nfrozen 1\n");
        cg.freeze().expect("freeze");
        assert_eq!(read(&dir.join("cgroup.freeze")), "1");
        write(&dir.join("cgroup.events"), "populated 1\nfrozen 0\n");
        cg.thaw().expect("thaw");
        assert_eq!(read(&dir.join("cgroup.freeze")), "0");
    }

    #[test]
    fn freeze_times_out_and_unfreezes() {
        let (_tmp, driver, _root) = setup();
        let (cg, dir) = make(&driver, "box");
        let err = cg.freeze().expect_err("never frozen");
        assert!(matches!(err, CgroupError::Timeout { .. }));
        assert_eq!(read(&dir.join("cgroup.freeze")), "0");

        fs::remove_file(dir.join("cgroup.freeze")).expect("rm");
        assert!(matches!(
            cg.freeze().expect_err("no freezer"),
            CgroupError::Unsupported { .. }
        ));
    }

    #[test]
    fn kill_all_uses_cgroup_kill() {
        let (_tmp, driver, _root) = setup();
        let (cg, dir) = make(&driver, "box");
        cg.kill_all().expect("kill_all");
        assert_eq!(read(&dir.join("cgroup.kill")), "1");
        cg.add_process(99).expect("add");
        assert_eq!(cg.pids().expect("pids"), vec![99]);
        assert!(matches!(
            cg.add_process(0).expect_err("pid 0"),
            CgroupError::InvalidPid(_)
        ));
    }

    #[test]
    fn children_get_the_controllers_and_go_first() {
        let (_tmp, driver, root) = setup();
        let cg = driver.create("box").expect("create");
        let dir = cg.paths().remove(0);
        write(&dir.join("cgroup.subtree_control"), "\n");
        let agent = cg.create_child("agent").expect("agent");
        // The controllers are delegated once, before the first child exists.
        assert_eq!(
            read(&dir.join("cgroup.subtree_control")),
            "+memory +cpu +pids"
        );
        write(&dir.join("cgroup.subtree_control"), "memory cpu pids\n");
        let workload = cg.create_child("workload").expect("workload");
        assert_eq!(
            read(&dir.join("cgroup.subtree_control")),
            "memory cpu pids\n"
        );
        assert_eq!(workload.name(), "box/workload");
        assert_eq!(
            workload.join_files(),
            vec![root.join("koder-sandbox/box/workload/cgroup.procs")]
        );
        assert_eq!(agent.name(), "box/agent");
        assert!(matches!(
            cg.create_child("agent").err().expect("dup"),
            CgroupError::AlreadyExists { .. }
        ));
        assert!(matches!(
            cg.open_child("gone").err().expect("missing"),
            CgroupError::NotFound { .. }
        ));
        assert_eq!(driver.list().expect("list"), vec!["box"]);
        // A plain directory keeps its files; the kernel's would vanish with rmdir.
        fs::remove_file(dir.join("cgroup.subtree_control")).expect("rm");
        driver
            .open("box")
            .expect("open")
            .destroy()
            .expect("destroy");
        assert!(!dir.exists());
    }

    #[test]
    fn destroy_is_idempotent() {
        let (_tmp, driver, root) = setup();
        let cg = driver.create("box").expect("create");
        cg.destroy().expect("destroy");
        assert!(!root.join("koder-sandbox/box").exists());
        cg.destroy().expect("destroy again");
        assert!(driver.list().expect("list").is_empty());
    }
}
